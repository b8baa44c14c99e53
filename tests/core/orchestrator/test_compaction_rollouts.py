"""Compaction in the rollout loop: segments, the summary trained, failures handled and counted.

A multi-turn game (and a tool game) whose replies fill a small context (max_model_len 160,
threshold 0.5: a working context of 80 tokens) over the tiny model's tokenizer, with a
scripted policy that writes a summary when it is given the instruction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from telescope.api import events
from telescope.api.compaction import Compactor
from telescope.api.context import CompactionContext
from telescope.api.environment import MultiTurnEnvironment, RolloutState
from telescope.api.records import FinishReason, Message, RewardResult, Rollout, Sample, TrainingSample
from telescope.api.tools import ToolEnvironment
from telescope.compaction.builtins import SUMMARY_HEADER, TOOL_OUTPUT_MARKER, DropToolOutputs, Sliding, Summarize
from telescope.inference.generation import Generation
from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.rollouts import RolloutLimits, run_rollout

INSTRUCTION = "Summarize."
LIMITS = RolloutLimits(max_tokens=16, max_model_len=160)
CONTEXT = CompactionContext(max_model_len=160, threshold=0.5, instruction=INSTRUCTION, keep_turns=1)


class LongGame(MultiTurnEnvironment):
    """Says 'again N' after every reply, for up to 8 turns; reward = the turns played."""

    name = "long_game"
    max_turns = 8

    def load_dataset(self) -> list[Sample]:
        return [Sample(prompt="start", sample_id="0")]

    def env_response(self, messages: list[Message], state: RolloutState) -> list[Message]:
        return [{"role": "user", "content": f"again {state.turn}"}]

    def compute_reward(self, messages: list[Message], sample: Sample, state: RolloutState) -> RewardResult:
        return RewardResult(total_reward=float(state.turn))


def add(a: int, b: int) -> str:
    """Add two numbers, with a long report."""
    return f"{a + b} " + "padding " * 30


class AddGame(ToolEnvironment):
    name = "add_game"
    max_turns = 8
    tools: ClassVar[list[Callable[..., Any]]] = [add]

    def load_dataset(self) -> list[Sample]:
        return [Sample(prompt="add", sample_id="0")]

    def compute_reward(self, messages: list[Message], sample: Sample, state: RolloutState) -> RewardResult:
        return RewardResult(total_reward=1.0)


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(build_tokenizer(PRESETS["test"]))


class Policy:
    """Replies by turn; writes ``summary`` (finishing with ``summary_finish``) when it is given the instruction."""

    def __init__(
        self, renderer: ChatRenderer, summary: str = "we played", summary_finish: FinishReason = "stop", reply: str = ""
    ) -> None:
        self.renderer, self.summary, self.summary_finish = renderer, summary, summary_finish
        self.reply = reply or "reply {turn} with a few words"
        self.prompts: list[list[int]] = []
        self.summaries = 0
        self.max_model_len = LIMITS.max_model_len

    async def __call__(self, prompt_ids: list[int], max_tokens: int, turn: int) -> Generation:
        self.prompts.append(list(prompt_ids))
        assert len(prompt_ids) + max_tokens <= self.max_model_len
        eos = self.renderer.eos_token_id
        assert eos is not None
        text = self.renderer.decode(prompt_ids)
        if text.rstrip().endswith(f"{INSTRUCTION}\nassistant") or INSTRUCTION in text[-40:]:
            self.summaries += 1
            ids = [*self.renderer.encode(self.summary), eos] if self.summary_finish == "stop" else [50] * max_tokens
            return Generation(ids, [-0.25] * len(ids), self.summary_finish, 0, 0)
        ids = [*self.renderer.encode(self.reply.format(turn=turn)), eos][:max_tokens]
        finish: FinishReason = "stop" if len(ids) < max_tokens or ids[-1] == eos else "length"
        return Generation(ids, [-0.5] * len(ids), finish, 0, 0)


def play(
    renderer: ChatRenderer,
    policy: Policy,
    compactor: Compactor | None,
    environment: MultiTurnEnvironment | None = None,
    limits: RolloutLimits = LIMITS,
) -> Rollout:
    env = environment or LongGame()
    sample = env.load_dataset()[0]
    messages = env.format_prompt(sample)
    return asyncio.run(
        run_rollout(
            env,
            sample,
            messages,
            renderer.prompt_ids(messages),
            renderer=renderer,
            generate=policy,
            policy_version=lambda: 0,
            limits=limits,
            compactor=compactor,
        )
    )


def tokens(turns: list[Any]) -> int:
    return sum(len(t.input_token_ids) + len(t.output_token_ids) for t in turns)


def test_without_compaction_the_episode_ends_at_max_model_len(renderer: ChatRenderer) -> None:
    rollout = play(renderer, Policy(renderer), None)
    assert rollout.segments == [] and rollout.finish_reason == "length"
    assert len(rollout.turns) < LongGame.max_turns


@pytest.mark.parametrize("interleaved", [True, False])
def test_summarize_continues_from_the_prompt_and_the_summary_and_trains_the_summary(
    renderer: ChatRenderer, interleaved: bool
) -> None:
    policy = Policy(renderer)
    seen: list[dict[str, Any]] = []
    unsubscribe = events.subscribe(seen.append)
    limits = RolloutLimits(LIMITS.max_tokens, LIMITS.max_model_len, interleaved=interleaved)
    try:
        rollout = play(renderer, policy, Summarize(CONTEXT), limits=limits)
    finally:
        unsubscribe()
    assert rollout.error is None and rollout.compactions >= 1 and rollout.compaction_failures == ()
    assert len(rollout.segments) == rollout.compactions == policy.summaries
    assert rollout.reward is not None and rollout.reward.total_reward == LongGame.max_turns  # played to its end
    prompt = LongGame().format_prompt(LongGame().load_dataset()[0])
    for closed, following in zip(rollout.segments, [*rollout.segments[1:], rollout.turns], strict=True):
        summary = closed[-1]
        # the summary closes its segment, asked for right after the environment's reply, and is trained
        assert summary.output_text == "we played"
        assert renderer.decode(summary.input_token_ids).rstrip().endswith(f"{INSTRUCTION}\nassistant")
        assert tokens(closed) <= LIMITS.max_model_len
        # the next segment starts from the system prompt and task, then the summary
        restart = [*prompt, {"role": "user", "content": SUMMARY_HEADER + "we played"}]
        assert following[0].input_token_ids == renderer.prompt_ids(restart)
    samples = TrainingSample.all_from_rollout(rollout, advantage=0.5)
    assert len(samples) == len(rollout.segments) + 1 and {s.advantage for s in samples} == {0.5}
    first = samples[0]
    n_summary = len(rollout.segments[0][-1].output_token_ids)
    assert first.loss_mask[-n_summary:] == [True] * n_summary  # the summary's tokens are the policy's actions
    done = [e for e in seen if e["kind"] == "rollout.compaction"]
    assert len(done) == rollout.compactions and all(e["ok"] for e in done)
    # compacted once a reply of max_tokens might not fit in the working context (with the environment's
    # pending reply), not before; the new context leaves room for one
    room = CONTEXT.working_limit - LIMITS.max_tokens
    assert all(e["context_tokens"] > room >= e["new_context_tokens"] for e in done)
    # no reply was cut by the threshold: every turn ended by itself
    assert all(t.finish_reason == "stop" for turns in [*rollout.segments, rollout.turns] for t in turns)


@pytest.mark.parametrize(("summary", "finish", "reason"), [("", "stop", "empty"), ("x", "length", "overflow")])
def test_a_failed_summary_is_counted_dropped_and_the_episode_goes_on_uncompacted(
    renderer: ChatRenderer, summary: str, finish: FinishReason, reason: str
) -> None:
    policy = Policy(renderer, summary=summary, summary_finish=finish)
    rollout = play(renderer, policy, Summarize(CONTEXT))
    assert rollout.error is None and rollout.compactions == 0 and rollout.compaction_failures == (reason,)
    assert policy.summaries == 1  # no second attempt in this episode
    assert rollout.segments == []
    assert all(renderer.decode(t.input_token_ids).find(INSTRUCTION) < 0 for t in rollout.turns)  # the request dropped
    assert rollout.finish_reason == "length" and tokens(rollout.turns) > CONTEXT.working_limit  # up to max_model_len


def test_a_compacted_context_that_does_not_fit_under_the_threshold_fails(renderer: ChatRenderer) -> None:
    long_summary = " ".join(["word"] * 60)  # the prompt and this summary are over the 80-token working context
    rollout = play(renderer, Policy(renderer, summary=long_summary), Summarize(CONTEXT))
    assert rollout.compaction_failures == ("overflow",) and rollout.segments == []


def test_sliding_keeps_the_prompt_and_the_last_turn(renderer: ChatRenderer) -> None:
    rollout = play(renderer, Policy(renderer), Sliding(CONTEXT))
    assert rollout.compactions >= 1 and rollout.error is None
    closed = rollout.segments[0]
    prompt = LongGame().format_prompt(LongGame().load_dataset()[0])
    last_reply = closed[-1].output_text
    restart = [
        *prompt,
        {"role": "assistant", "content": last_reply},
        {"role": "user", "content": f"again {len(closed)}"},
    ]
    following = rollout.segments[1] if len(rollout.segments) > 1 else rollout.turns
    assert following[0].input_token_ids == renderer.prompt_ids(restart)


def test_drop_tool_outputs_in_a_tool_environment(renderer: ChatRenderer) -> None:
    call = '<tool_call>{{"name": "add", "arguments": {{"a": {turn}, "b": 1}}}}</tool_call>'
    policy = Policy(renderer, reply=call)
    policy.max_model_len = 1000
    limits = RolloutLimits(max_tokens=64, max_model_len=1000)
    context = CompactionContext(max_model_len=1000, threshold=0.5, keep_turns=1)
    rollout = play(renderer, policy, DropToolOutputs(context), AddGame(), limits)
    assert rollout.compactions >= 1 and rollout.error is None
    tool_messages = [m["content"] for m in rollout.messages if m["role"] == "tool"]
    assert TOOL_OUTPUT_MARKER in tool_messages and tool_messages[-1] != TOOL_OUTPUT_MARKER
