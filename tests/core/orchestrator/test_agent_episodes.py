"""Agent episodes: an agent program's calls through the gateway, recorded and assembled into training samples.

The program under test is driven by real clients (the ``openai`` SDK here; the Agents SDK
and MCP in test_agent_clients.py) against the gateway served in the test's event loop;
the policy is scripted (:class:`ScriptedPolicy`) so that replies, tool calls included, are
chosen. What is asserted is what trains: the recorded tokens, which calls merge into one
sequence, which stand alone, and how failures are contained.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import httpx
import openai
import pytest

from telescope.api.agent import AgentEnvironment
from telescope.api.records import RewardResult, Sample, TrainingSample
from telescope.inference.generation import ServerUnavailable
from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.agent_episodes import RecordedCall, assemble

from .agent_helpers import SAMPLE, ScriptedPolicy, run_episode

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]
CALL_ADD = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(PRESETS["test"])


class ToolLoop(AgentEnvironment):
    """A plain openai-SDK tool loop: ask, run the tools the model calls, ask again, until it answers."""

    name = "calc"
    seen: ClassVar[list[str]] = []

    def load_dataset(self) -> list[Sample]:
        return [SAMPLE]

    async def run(self, client: openai.AsyncOpenAI, sample: Sample) -> float:
        messages: list[Any] = [{"role": "user", "content": str(sample.prompt)}]
        for _ in range(4):
            reply = await client.chat.completions.create(model="any-name", messages=messages, tools=TOOLS)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                self.seen.append(message.content or "")
                return 1.0 if str(sample.answer) in (message.content or "") else 0.0
            for call in message.tool_calls:
                arguments = json.loads(call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": str(sum(arguments.values()))})
        return 0.0


def test_a_tool_loop_trains_as_one_sequence_of_the_recorded_tokens(tokenizer: Any) -> None:
    policy = ScriptedPolicy(tokenizer, [CALL_ADD, "The sum is 5."])
    rollout = run_episode(tokenizer, ToolLoop(), policy)
    assert rollout.error is None and rollout.reward is not None and rollout.reward.total_reward == 1.0
    first, second = policy.prompts
    completion = rollout.turns[0].output_token_ids
    # the second call reads the first call's prompt and completion tokens exactly, then the tool's result
    assert second[: len(first) + len(completion)] == [*first, *completion]
    assert "<|im_start|>tool\n5<|im_end|>" in tokenizer.decode(second[len(first) + len(completion) :])
    assert len(rollout.turns) == 2 and rollout.segments == []
    (sample,) = TrainingSample.all_from_rollout(rollout, advantage=0.5)
    assert sample.token_ids == [*second, *rollout.turns[1].output_token_ids]
    trained = [t for t, keep in zip(sample.token_ids, sample.loss_mask, strict=True) if keep]
    assert trained == [*completion, *rollout.turns[1].output_token_ids]  # only what the model produced
    assert [c["continues"] for c in rollout.agent_calls] == [None, 0]
    # the store keeps each call's new messages only: the history is the continued call's
    assert [c["first_message"] for c in rollout.agent_calls] == [0, 2]
    assert [m["role"] for m in rollout.agent_calls[1]["messages"]] == ["tool"]
    assert rollout.reward.sample_metrics["agent/calls_continued"] == 1.0
    assert rollout.reward.sample_metrics["agent/retokenization_mismatches"] == 0.0


def test_each_call_and_each_tool_call_is_a_timeline_event(tokenizer: Any) -> None:
    from telescope.api import events

    seen: list[Any] = []
    unsubscribe = events.subscribe(seen.append)
    try:
        with events.context(group_id=7):
            run_episode(tokenizer, ToolLoop(), ScriptedPolicy(tokenizer, [CALL_ADD, "The sum is 5."]))
    finally:
        unsubscribe()
    calls = [e for e in seen if e["kind"] == "agent.call"]
    tools = [e for e in seen if e["kind"] == "agent.tool_call"]
    assert [(e["call"], e["continues"], e["tool_calls"]) for e in calls] == [(0, None, ["add"]), (1, 0, [])]
    assert all(e["group_id"] == 7 for e in calls + tools)  # the rollout's ids, though the gateway answers elsewhere
    (tool,) = tools
    assert tool["tool"] == "add" and tool["call"] == 0 and tool["result_read_by"] == 1
    assert tool["start"] >= calls[0]["start"] and tool["duration_s"] >= 0
    (episode,) = [e for e in seen if e["kind"] == "agent.episode"]
    assert episode["calls"] == 2 and episode["sequences"] == 1 and episode["reward"] == 1.0


def test_a_reply_the_template_renders_otherwise_keeps_its_tokens_and_is_counted(tokenizer: Any) -> None:
    compact = '<tool_call>{"name":"add","arguments":{"a":2,"b":3}}</tool_call>'  # the template adds spaces
    policy = ScriptedPolicy(tokenizer, [compact, "5"])
    rollout = run_episode(tokenizer, ToolLoop(), policy)
    first, second = policy.prompts
    assert second[: len(first)] == first
    assert second[len(first) : len(first) + len(rollout.turns[0].output_token_ids)] == rollout.turns[0].output_token_ids
    assert rollout.reward is not None and rollout.reward.sample_metrics["agent/retokenization_mismatches"] == 1.0
    assert [c["mismatch"] for c in rollout.agent_calls] == [False, True]
    assert len(rollout.sequences) == 1


class SubAgent(AgentEnvironment):
    """A main agent that asks a sub-agent (another conversation) and then answers."""

    name = "delegating"

    def load_dataset(self) -> list[Sample]:
        return [SAMPLE]

    async def run(self, client: openai.AsyncOpenAI, sample: Sample) -> float:
        helper = await client.chat.completions.create(
            model="policy",
            messages=[{"role": "system", "content": "you are a helper"}, {"role": "user", "content": "2+3?"}],
        )
        note = helper.choices[0].message.content or ""
        final = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": f"{sample.prompt}; a helper says {note}"}]
        )
        return 1.0 if "5" in (final.choices[0].message.content or "") else 0.0


def test_a_call_that_extends_no_other_is_its_own_sample_with_the_episode_advantage(tokenizer: Any) -> None:
    policy = ScriptedPolicy(tokenizer, ["5", "it is 5"])
    rollout = run_episode(tokenizer, SubAgent(), policy)
    assert len(rollout.segments) == 1 and len(rollout.turns) == 1
    assert rollout.turns[0].input_token_ids == policy.prompts[1]  # the last call is the main sequence
    assert rollout.segments[0][0].input_token_ids == policy.prompts[0]
    samples = TrainingSample.all_from_rollout(rollout, advantage=-0.25)
    assert [s.advantage for s in samples] == [-0.25, -0.25]
    assert [c["sequence"] for c in rollout.agent_calls] == [0, 1]


class Concurrent(AgentEnvironment):
    """After one call, two follow-ups on the same history at once, then a reply to one of them."""

    name = "concurrent"

    def load_dataset(self) -> list[Sample]:
        return [SAMPLE]

    async def run(self, client: openai.AsyncOpenAI, sample: Sample) -> float:
        history: list[Any] = [{"role": "user", "content": "hi"}]
        first = await client.chat.completions.create(model="policy", messages=history)
        history.append({"role": "assistant", "content": first.choices[0].message.content})
        a, b = await asyncio.gather(
            *(
                client.chat.completions.create(model="policy", messages=[*history, {"role": "user", "content": q}])
                for q in ("one?", "two?")
            )
        )
        return float(bool(a.choices[0].message.content and b.choices[0].message.content))


def test_concurrent_calls_of_one_episode_each_continue_the_shared_history(tokenizer: Any) -> None:
    policy = ScriptedPolicy(tokenizer, ["hello", "first", "second"])
    policy.delay_s = 0.05  # the two follow-ups overlap
    rollout = run_episode(tokenizer, Concurrent(), policy)
    assert rollout.error is None
    calls = rollout.agent_calls
    assert [c["continues"] for c in calls] == [None, 0, 0]
    # both follow-ups start with the first call's recorded tokens; one joins its sequence, the other stands alone
    joined = next(sequence for sequence in rollout.sequences if len(sequence) == 2)
    head = [*policy.prompts[0], *joined[0].output_token_ids]
    assert all(prompt[: len(head)] == head for prompt in policy.prompts[1:])
    assert sorted(len(sequence) for sequence in rollout.sequences) == [1, 2]
    # every generated token trains exactly once
    generated = sum(len(turn.output_token_ids) for sequence in rollout.sequences for turn in sequence)
    assert generated == sum(c["completion_tokens"] for c in calls)


def test_a_streamed_call_is_answered_and_recorded(tokenizer: Any) -> None:
    class Streaming(ToolLoop):
        async def run(self, client: openai.AsyncOpenAI, sample: Sample) -> float:
            stream = await client.chat.completions.create(
                model="policy",
                messages=[{"role": "user", "content": "say 5"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            text, usage = "", None
            async for chunk in stream:
                text += "".join(c.delta.content or "" for c in chunk.choices)
                usage = chunk.usage or usage
            assert usage is not None and usage.completion_tokens == 3
            return 1.0 if text == "5 5" else 0.0

    rollout = run_episode(tokenizer, Streaming(), ScriptedPolicy(tokenizer, ["5 5"]))
    assert rollout.reward is not None and rollout.reward.total_reward == 1.0
    assert len(rollout.agent_calls) == 1 and rollout.turns[0].output_text == "5 5"


class Failing(AgentEnvironment):
    """A program that fails in a chosen way."""

    name = "failing"
    episode_timeout_s: ClassVar[float | None] = 60.0  # the "hang" case sets a short one: the others must not meet it
    max_calls: ClassVar[int] = 2
    mode = "raise"
    urls: ClassVar[list[str]] = []

    def load_dataset(self) -> list[Sample]:
        return [SAMPLE]

    async def run(self, client: openai.AsyncOpenAI, sample: Sample) -> Any:
        self.urls.append(str(client.base_url))
        if self.mode == "never":
            return 1.0
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
        if self.mode == "raise":
            raise ValueError("the harness broke")
        if self.mode == "hang":
            await asyncio.sleep(30)
        if self.mode == "nan":
            return float("nan")
        if self.mode == "over_limit":
            for _ in range(3):
                await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
        return RewardResult(total_reward=0.5, sample_metrics={"mine": 1.0})


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("raise", "ValueError in run of sample '0' (calc): the harness broke"),
        ("hang", "timeout/agent: run of sample '0' (calc) took more than episode_timeout_s=0.5"),
        ("never", "never called the model"),
        ("nan", "non-finite reward"),
        ("over_limit", "BadRequestError in run of sample '0' (calc)"),
    ],
)
def test_a_failing_program_is_an_errored_rollout_naming_its_sample(tokenizer: Any, mode: str, expected: str) -> None:
    environment = Failing()
    environment.mode = mode
    if mode == "hang":
        environment.episode_timeout_s = 0.5  # type: ignore[misc]
    rollout = run_episode(tokenizer, environment, ScriptedPolicy(tokenizer, ["ok"]))
    assert rollout.error is not None and expected in rollout.error, rollout.error
    assert rollout.reward is not None and rollout.reward.total_reward == 0.0
    if mode == "over_limit":
        assert "max_calls" in rollout.error and rollout.reward.sample_metrics["agent/calls_refused"] == 1.0


def test_a_program_that_succeeds_returns_its_reward_and_metrics(tokenizer: Any) -> None:
    environment = Failing()
    environment.mode = "ok"
    rollout = run_episode(tokenizer, environment, ScriptedPolicy(tokenizer, ["ok"]))
    assert rollout.error is None and rollout.reward is not None
    assert rollout.reward.total_reward == 0.5 and rollout.reward.sample_metrics["mine"] == 1.0


def test_an_ended_episode_and_a_caller_without_the_key_are_refused(tokenizer: Any) -> None:
    from telescope.orchestrator.agent_gateway import AgentGateway, run_agent_episode
    from telescope.orchestrator.rollouts import RolloutLimits

    captured: dict[str, Any] = {}

    class Probe(Failing):
        async def run(self, client: openai.AsyncOpenAI, sample: Sample) -> Any:
            url = str(client.base_url)
            auth = {"Authorization": f"Bearer {client.api_key}"}
            async with httpx.AsyncClient() as plain:
                if "first" in captured:  # the second episode: the first one's URL has ended
                    captured["ended"] = (await plain.get(captured["first"] + "models", headers=auth)).status_code
                captured.setdefault("first", url)
                captured["no_key"] = (await plain.get(url + "models")).status_code
                other = url.replace("/episodes/", "/episodes/x") + "models"
                captured["other_episode"] = (await plain.get(other, headers=auth)).status_code
                plain_route = url.split("/episodes/")[0] + "/v1/completions"
                answer = await plain.post(plain_route, json={"model": "policy", "prompt": "x"}, headers=auth)
                captured["no_default_backend"] = answer.status_code
            return await super().run(client, sample)

    async def two_episodes() -> None:
        gateway = await AgentGateway(tokenizer, chat_template=None, max_model_len=1024, model_name="policy").start()
        try:
            for _ in range(2):
                probe = Probe()
                probe.mode = "ok"
                policy = ScriptedPolicy(tokenizer, ["ok"])
                await run_agent_episode(
                    probe,
                    SAMPLE,
                    gateway=gateway,
                    generate=policy,
                    policy_version=lambda: 0,
                    limits=RolloutLimits(8, 1024),
                )
        finally:
            await gateway.close()

    asyncio.run(two_episodes())
    assert captured["ended"] == 404 and captured["other_episode"] == 404
    assert captured["no_key"] == 401 and captured["no_default_backend"] == 503


def test_a_server_that_fails_under_the_episode_is_raised_for_redispatch(tokenizer: Any) -> None:
    class Down(ScriptedPolicy):
        async def __call__(self, prompt_ids: list[int], max_tokens: int, turn: int) -> Any:
            raise ServerUnavailable(3, "it died")

    with pytest.raises(ServerUnavailable, match="inference server 3"):
        run_episode(tokenizer, ToolLoop(), Down(tokenizer, ["x"]))


def _call(index: int, prompt: list[int], completion: list[int]) -> RecordedCall:
    return RecordedCall(
        index=index,
        route="chat",
        prompt_ids=prompt,
        completion_ids=completion,
        logprobs=[-1.0] * len(completion),
        token_versions=[0] * len(completion),
        policy_version=0,
        finish_reason="stop",
        start=0.0,
        latency_s=0.0,
        request_id=str(index),
    )


def test_assembly_by_hand() -> None:
    calls = [
        _call(0, [1, 2], [3]),
        _call(1, [9, 9], [8]),  # another conversation
        _call(2, [1, 2, 3, 4], [5, 6]),  # extends call 0: its new input is [4]
        _call(3, [1, 2, 3, 4, 5, 6, 7], [0]),  # extends call 2
    ]
    main, others = assemble(calls)
    assert [(t.input_token_ids, t.output_token_ids) for t in main] == [([1, 2], [3]), ([4], [5, 6]), ([7], [0])]
    assert [[(t.input_token_ids, t.output_token_ids) for t in s] for s in others] == [[([9, 9], [8])]]
    assert [c.sequence for c in calls] == [1, 0, 1, 1]
    assert assemble([]) == ([], [])
