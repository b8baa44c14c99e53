"""Multi-turn rollouts: exact token reuse across turns, loss masks, per-turn policy versions."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from telescope.api.environment import MultiTurnEnvironment, RolloutState
from telescope.api.records import Message, RewardResult, Sample
from telescope.inference.generation import Generation
from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.rollouts import RolloutLimits, run_rollout


class EchoGame(MultiTurnEnvironment):
    """Replies 'again' twice, then the interaction ends; reward = number of turns."""

    name = "echo_game"
    max_turns = 3

    def load_dataset(self) -> list[Sample]:
        return [Sample(prompt="start", sample_id="0")]

    def env_response(self, messages: list[Message], state: RolloutState) -> list[Message]:
        return [{"role": "user", "content": f"again {state.turn}"}]

    def compute_reward(self, messages: list[Message], sample: Sample, state: RolloutState) -> RewardResult:
        return RewardResult(total_reward=float(state.turn), sample_metrics={"turns": float(state.turn)})


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(build_tokenizer(PRESETS["test"]))


def scripted_generate(renderer: ChatRenderer, replies: list[str], versions: list[int], seen: list[list[int]]) -> Any:
    async def generate(prompt_ids: list[int], max_tokens: int, turn: int) -> Generation:
        seen.append(list(prompt_ids))
        eos = renderer.eos_token_id
        assert eos is not None
        ids = [*renderer.encode(replies[turn]), eos]
        return Generation(ids, [-0.5] * len(ids), "stop", versions[turn], versions[turn])

    return generate


def test_turns_reuse_tokens_exactly_and_match_the_template(renderer: ChatRenderer) -> None:
    env = EchoGame()
    sample = env.load_dataset()[0]
    messages = env.format_prompt(sample)
    replies = ["first (1 + 2)", "second", "third"]
    version = iter([0, 1, 1])
    seen: list[list[int]] = []
    rollout = asyncio.run(
        run_rollout(
            env,
            sample,
            messages,
            renderer.prompt_ids(messages),
            renderer=renderer,
            generate=scripted_generate(renderer, replies, [0, 1, 1], seen),
            policy_version=lambda: next(version),
            limits=RolloutLimits(max_tokens=32, max_model_len=512),
        )
    )
    assert [t.output_text for t in rollout.turns] == replies
    assert rollout.reward is not None and rollout.reward.total_reward == 3.0
    # each request's prompt is exactly the trajectory so far: earlier tokens are never re-tokenized
    for turn_index, prompt in enumerate(seen):
        so_far: list[int] = []
        for t in rollout.turns[:turn_index]:
            so_far += t.input_token_ids + t.output_token_ids
        assert prompt == so_far + rollout.turns[turn_index].input_token_ids
    # and the whole trajectory is what the chat template gives for the whole conversation
    full = renderer.encode(renderer.render_text(rollout.messages, add_generation_prompt=False))
    assert full[: len(rollout.token_ids)] == rollout.token_ids
    assert renderer.decode(full[len(rollout.token_ids) :], skip_special_tokens=False) == "\n"
    # only generated tokens are trained on; each turn keeps its dispatch version
    mask = rollout.loss_mask
    assert sum(mask) == sum(len(t.output_token_ids) for t in rollout.turns)
    assert [t.policy_version for t in rollout.turns] == [0, 1, 1]
    assert rollout.oldest_policy_version == 0


def test_a_reply_cut_by_length_is_closed_by_the_template(renderer: ChatRenderer) -> None:
    history: list[Message] = [{"role": "user", "content": "hi"}]
    generated = renderer.encode("an unfinished rep")  # no end-of-turn token: stopped by length
    reply: Message = {"role": "assistant", "content": renderer.decode(generated)}
    new: list[Message] = [{"role": "user", "content": "go on"}]
    ids = renderer.prompt_ids(history) + generated + renderer.continuation_ids(history, reply, generated, new)
    expected = renderer.encode(renderer.render_text([*history, reply, *new], add_generation_prompt=True))
    assert ids == expected


def test_environment_failures_mark_the_rollout(renderer: ChatRenderer) -> None:
    class Broken(EchoGame):
        def env_response(self, messages: list[Message], state: RolloutState) -> list[Message]:
            raise RuntimeError("the game crashed")

    env = Broken()
    sample = env.load_dataset()[0]
    messages = env.format_prompt(sample)
    rollout = asyncio.run(
        run_rollout(
            env,
            sample,
            messages,
            renderer.prompt_ids(messages),
            renderer=renderer,
            generate=scripted_generate(renderer, ["a", "b", "c"], [0, 0, 0], []),
            policy_version=lambda: 0,
            limits=RolloutLimits(max_tokens=32, max_model_len=512),
        )
    )
    assert rollout.error is not None and "the game crashed" in rollout.error
    assert rollout.reward is not None and rollout.reward.total_reward == 0.0
