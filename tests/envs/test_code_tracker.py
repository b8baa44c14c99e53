"""The code tracker: its rules, its demonstrations, and an episode that only compaction lets finish.

The rollout tests play whole 32-turn episodes through the real rollout loop over the
tiny model's tokenizer, at the example's lengths (max_model_len 256), with a scripted
policy that answers the latest code in its context: with ``sliding`` compaction it
answers every turn; without, the context fills a third of the way in.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from pathlib import Path
from typing import Any

import pytest

from telescope.api.context import CompactionContext
from telescope.api.records import Rollout, Sample
from telescope.compaction.builtins import Sliding
from telescope.config import load_config
from telescope.inference.generation import Generation, GenerationService, SamplingSettings
from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.evals import EvalRunner
from telescope.orchestrator.rollouts import RolloutLimits, run_rollout
from telescope.orchestrator.warm_start import played_demonstration
from telescope.plugins.facade import get_plugins
from telescope.testing.environment import EnvironmentConformance
from telescope_envs.code_tracker import CodeTrackerEnvironment, answered_code, code_schedule

EXAMPLE = Path(__file__).parents[2] / "configs" / "examples" / "cpu" / "code_tracker_tiny.yaml"
LIMITS = RolloutLimits(max_tokens=8, max_model_len=256)
SLIDING = CompactionContext(max_model_len=256, threshold=0.8, instruction="", keep_turns=2)


class TestCodeTrackerConformance(EnvironmentConformance):
    def environment_factory(self) -> CodeTrackerEnvironment:
        return CodeTrackerEnvironment(num_samples=8, num_turns=6)

    def right_replies(self, sample: Sample) -> list[str] | None:
        return [f"[{code}]" for code in sample.answer]


def play_replies(env: CodeTrackerEnvironment, sample: Sample, replies: list[str]) -> tuple[float, dict[str, float]]:
    messages, state, _ = env.play_replies(sample, replies)
    result = env.compute_reward(messages, sample, state)
    return result.total_reward, result.sample_metrics


def test_the_schedule_changes_to_a_different_two_digit_code() -> None:
    import random

    codes = code_schedule(random.Random(3), 200, 0.3)
    assert len(codes) == 200 and all(10 <= c <= 99 for c in codes)
    changes = sum(a != b for a, b in itertools.pairwise(codes))
    assert 40 <= changes <= 80  # about 0.3 of 199 turns


def test_answers_are_scored_turn_by_turn_against_the_code_in_force() -> None:
    env = CodeTrackerEnvironment(num_samples=50, num_turns=32)
    sample = next(s for s in env.load_dataset() if len(set(s.answer)) > 3)
    codes = sample.answer
    right, metrics = play_replies(env, sample, [f"[{c}]" for c in codes])
    assert right == 1.0
    assert metrics == {"correct": 1.0, "correct_turns": 32.0, "turns_played": 32.0, "completed": 1.0}
    stale, _ = play_replies(env, sample, [f"the code is [{codes[0]}]"] * 32)
    assert stale == pytest.approx(codes.count(codes[0]) / 32) and stale < 1.0
    half, metrics = play_replies(env, sample, [f"[{c}]" for c in codes[:16]])
    assert half == 0.5 and metrics["completed"] == 0.0 and metrics["correct"] == 0.0  # unplayed turns are wrong
    assert play_replies(env, sample, ["no idea"] * 32)[0] == 0.0
    assert answered_code("[12] or rather [34]") == 34 and answered_code("12") is None


def test_the_messages_announce_changes_only() -> None:
    env = CodeTrackerEnvironment(num_samples=1, num_turns=5)
    sample = Sample(prompt="p", answer=[11, 11, 42, 42, 17])
    state = env.initial_state(sample)
    messages = env.format_prompt(sample)
    said = []
    for code in sample.answer[:-1]:
        messages.append({"role": "assistant", "content": f"[{code}]"})
        state.turn += 1
        assert not env.is_done(messages, state)
        said.append(env.env_response(messages, state)[0]["content"])
    assert said == ["same", "new 42", "same", "new 17"]


def test_bad_settings_are_refused() -> None:
    for kwargs, fragment in [
        ({"num_turns": 0}, "num_turns"),
        ({"change_probability": 1.5}, "change_probability"),
        ({"num_samples": 0}, "num_samples"),
        ({"num_turns": 3, "demonstrated_turns": 4}, "demonstrated_turns"),
    ]:
        with pytest.raises(ValueError, match=fragment):
            CodeTrackerEnvironment(**kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(build_tokenizer(PRESETS["small"]))


def test_the_warm_start_plays_the_first_turns_each_in_its_own_conversation(renderer: ChatRenderer) -> None:
    env = CodeTrackerEnvironment(num_samples=20, demonstrated_turns=4)
    sample = next(s for s in env.load_dataset() if s.answer[1] != s.answer[0])
    examples = played_demonstration(env, sample, env.demonstration_turns(sample) or [], renderer)
    assert [renderer.decode(e.completion_ids).strip() for e in examples] == [f"[{c}]" for c in sample.answer[:4]]
    second_prompt = renderer.decode(examples[1].prompt_ids)
    assert f"[{sample.answer[0]}]" in second_prompt and f"new {sample.answer[1]}" in second_prompt
    assert all(a.prompt_ids == b.prompt_ids[: len(a.prompt_ids)] for a, b in itertools.pairwise(examples))


class LatestCodePolicy:
    """Answers the last number in its context (the prompt's code, a ``new N``, or its own last answer)."""

    def __init__(self, renderer: ChatRenderer) -> None:
        self.renderer = renderer
        self.longest_prompt = 0

    async def __call__(self, prompt_ids: list[int], max_tokens: int, turn: int) -> Generation:
        self.longest_prompt = max(self.longest_prompt, len(prompt_ids))
        numbers = re.findall(r"\d+", self.renderer.decode(prompt_ids))
        eos = self.renderer.eos_token_id
        assert eos is not None
        ids = [*self.renderer.encode(f"[{numbers[-1]}]"), eos][:max_tokens]
        return Generation(ids, [-0.1] * len(ids), "stop", 0, 0)


def episode(renderer: ChatRenderer, compaction: bool) -> tuple[Rollout, LatestCodePolicy]:
    env = CodeTrackerEnvironment(num_samples=10, num_turns=32)
    sample = env.load_dataset()[0]
    messages = env.format_prompt(sample)
    policy = LatestCodePolicy(renderer)
    rollout = asyncio.run(
        run_rollout(
            env,
            sample,
            messages,
            renderer.prompt_ids(messages),
            renderer=renderer,
            generate=policy,
            policy_version=lambda: 0,
            limits=LIMITS,
            compactor=Sliding(SLIDING) if compaction else None,
        )
    )
    return rollout, policy


def test_with_sliding_compaction_a_perfect_policy_answers_all_32_turns(renderer: ChatRenderer) -> None:
    rollout, policy = episode(renderer, compaction=True)
    assert rollout.error is None
    assert rollout.reward is not None
    assert rollout.reward.total_reward == 1.0 and rollout.reward.sample_metrics["turns_played"] == 32
    assert rollout.compactions >= 2 and len(rollout.segments) == rollout.compactions
    total = sum(len(t.input_token_ids) + len(t.output_token_ids) for s in [*rollout.segments, rollout.turns] for t in s)
    assert total > 2 * LIMITS.max_model_len  # the episode is far longer than one context
    assert policy.longest_prompt <= int(0.8 * LIMITS.max_model_len)


def test_without_compaction_the_context_ends_the_episode_a_third_of_the_way(renderer: ChatRenderer) -> None:
    rollout, policy = episode(renderer, compaction=False)
    assert rollout.error is None and rollout.compactions == 0
    assert rollout.reward is not None
    assert rollout.reward.sample_metrics["turns_played"] < 16 and rollout.reward.total_reward < 0.5
    assert policy.longest_prompt + LIMITS.max_tokens > 0.9 * LIMITS.max_model_len


class LatestCodeServers(GenerationService):
    """One inference server that answers as :class:`LatestCodePolicy`."""

    def __init__(self, renderer: ChatRenderer) -> None:
        self.policy = LatestCodePolicy(renderer)

    @property
    def num_servers(self) -> int:
        return 1

    async def generate(
        self,
        server: int,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        seed: int,
        priority: int,
        sampling: SamplingSettings,
    ) -> Generation:
        return await self.policy(prompt_ids, max_tokens, 0)


class Sink:
    def log_eval(self, name: str, step: int, metrics: dict[str, Any], **extra: Any) -> None:
        pass


@pytest.mark.parametrize(("compaction", "low", "high"), [("sliding", 1.0, 1.0), ("none", 0.2, 0.4)])
def test_an_eval_episode_compacts_as_a_training_one_does(
    renderer: ChatRenderer, compaction: str, low: float, high: float
) -> None:
    evals = "[{name: code_tracker, num_samples: 4, separate_eval_samples: false, kwargs: {num_samples: 20}}]"
    config = load_config(EXAMPLE, ["--compaction", compaction, "--evals", evals]).config
    runner = EvalRunner(config, get_plugins(), renderer, LatestCodeServers(renderer), Sink())
    metrics = asyncio.run(runner.run_all(step=0, servers=[0], phase="before"))
    reward = metrics["code_tracker"]["eval/code_tracker/reward_mean"]
    assert low <= reward <= high
    assert metrics["code_tracker"]["eval/code_tracker/correct_rate"] == (1.0 if compaction == "sliding" else 0.0)


def test_a_reply_cut_by_the_length_limit_leaves_the_question_standing() -> None:
    """The loop skips is_done for a reply cut by max_tokens (compaction then lets it go on): no answer, no shift."""
    env = CodeTrackerEnvironment(num_samples=10, num_turns=32)
    sample = env.load_dataset()[0]
    state = env.initial_state(sample)
    messages = env.format_prompt(sample)
    for index, code in enumerate(sample.answer):
        if index in (3, 20):  # a cut reply: counted as a model turn, never passed to is_done
            messages.append({"role": "assistant", "content": "[1 2 3 4"})
            state.turn += 1
        messages.append({"role": "assistant", "content": f"[{code}]"})
        state.turn += 1
        if env.is_done(messages, state):
            break
        messages.extend(env.env_response(messages, state))
    result = env.compute_reward(messages, sample, state)
    assert state.turn == 34 and result.total_reward == 1.0 and result.sample_metrics["completed"] == 1.0
