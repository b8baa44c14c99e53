"""The environments' keyword arguments that the upstream's example configs use.

``add_thinking_prefix`` (countdown, the math environments, i3_code): the prompt ends
with an open ``<think>`` assistant turn that the model continues; wordle's
``max_turns`` is its number of guesses; i3_code's ``provider``, ``pool_size``,
``memory_mb`` and ``disk_size_gb`` set its sandbox settings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.chat import ChatRenderer
from telescope_envs.countdown import CountdownEnvironment
from telescope_envs.hendrycks_math import HendrycksMathEnvironment
from telescope_envs.i3_code import I3CodeEnvironment
from telescope_envs.math_sets import DapoMathEnvironment, DeepScalerEnvironment
from telescope_envs.wordle import WordleEnvironment

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: CountdownEnvironment(dataset_name=str(DATA / "countdown.jsonl"), **kw),
        lambda **kw: HendrycksMathEnvironment(dataset_name=str(DATA / "math.jsonl"), **kw),
        lambda **kw: DapoMathEnvironment(dataset_name=str(DATA / "dapo_math.jsonl"), **kw),
        lambda **kw: DeepScalerEnvironment(dataset_name=str(DATA / "deepscaler.jsonl"), **kw),
        lambda **kw: I3CodeEnvironment(dataset_name=str(DATA / "i3_code.jsonl"), **kw),
    ],
)
def test_add_thinking_prefix_opens_the_assistant_turn(make) -> None:  # type: ignore[no-untyped-def]
    renderer = ChatRenderer(build_tokenizer(PRESETS["test"]))
    plain, prefixed = make(), make(add_thinking_prefix=True)
    sample = plain.load_dataset()[0]
    without, with_prefix = plain.format_prompt(sample), prefixed.format_prompt(sample)
    assert with_prefix == [*without, {"role": "assistant", "content": "<think>"}]
    text = renderer.tokenizer.decode(renderer.prompt_ids(with_prefix))
    assert text.endswith("<|im_start|>assistant\n<think>")  # left open: the model goes on from there
    assert renderer.tokenizer.decode(renderer.prompt_ids(without)).endswith("<|im_start|>assistant\n")


def test_countdown_scores_a_completion_that_continues_the_prefix() -> None:
    env = CountdownEnvironment(dataset_name=str(DATA / "countdown.jsonl"), add_thinking_prefix=True)
    sample = env.load_dataset()[0]
    nums, target = sample.answer["nums"], sample.answer["target"]
    from telescope_envs.countdown import solve

    completion = f" let me try things</think>\n<answer>{solve(nums, target)}</answer>"
    assert env.compute_reward(completion, sample).total_reward == 2.0


def test_wordle_max_turns_is_the_number_of_guesses() -> None:
    assert WordleEnvironment(max_turns=4).num_guesses == 4
    assert WordleEnvironment().num_guesses == 6
    assert WordleEnvironment(num_guesses=5, max_turns=5).num_guesses == 5
    with pytest.raises(ValueError, match="disagree"):
        WordleEnvironment(num_guesses=5, max_turns=4)
    with pytest.raises(ValueError, match="between 1 and 6"):
        WordleEnvironment(max_turns=7)


def test_i3_code_takes_the_upstream_sandbox_names() -> None:
    env = I3CodeEnvironment(
        dataset_name=str(DATA / "i3_code.jsonl"), provider="daytona", pool_size=10, memory_mb=512, disk_size_gb=1
    )
    assert (env.sandbox_provider, env.sandbox_pool_size, env.sandbox_memory_mb, env.sandbox_disk_mb) == (
        "daytona",
        10,
        512,
        1024,
    )
    default = I3CodeEnvironment(dataset_name=str(DATA / "i3_code.jsonl"))
    assert (default.sandbox_provider, default.sandbox_pool_size, default.sandbox_disk_mb) == (
        None,
        2,
        256,
    )  # None: the run's sandbox_provider (its context)
