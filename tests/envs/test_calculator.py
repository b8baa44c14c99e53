"""The calculator tool environment: tool calls, tool metrics, rewards, conformance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from telescope.api.records import Sample
from telescope.testing.environment import TOOL_METRIC_KEYS, EnvironmentConformance
from telescope_envs.calculator import CalculatorEnvironment

DATA = Path(__file__).parent / "data"


def call(name: str, **arguments: float) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class TestCalculatorConformance(EnvironmentConformance):
    def environment_factory(self) -> CalculatorEnvironment:
        return CalculatorEnvironment(dataset_name=str(DATA / "calculator.jsonl"))

    def right_replies(self, sample: Sample) -> list[str] | None:
        return [f"<answer>{sample.answer:g}</answer>"]


class TestGeneratedCalculatorConformance(EnvironmentConformance):
    def environment_factory(self) -> CalculatorEnvironment:
        return CalculatorEnvironment(num_samples=8, seed=1)


def test_rollout_with_tools_reports_the_documented_metrics() -> None:
    env = CalculatorEnvironment(dataset_name=str(DATA / "calculator.jsonl"))
    sample = env.load_dataset()[0]  # 2 + 3 - 1 = 4
    state = env.initial_state(sample)
    messages = env.format_prompt(sample)
    assert '"name": "add"' in messages[0]["content"] and '"name": "subtract"' in messages[0]["content"]
    replies = [
        call("add", a=2, b=3),
        call("subtract", a=5, b=1) + call("multiply", a=1, b=1),
        call("add", a=1),  # missing argument: an error the model sees
        "<answer>4</answer>",
    ]
    tool_outputs: list[str] = []
    for reply in replies:
        messages.append({"role": "assistant", "content": reply})
        state.turn += 1
        if env.is_done(messages, state):
            break
        new = env.env_response(messages, state)
        tool_outputs.extend(m["content"] for m in new)
        messages.extend(new)
    assert tool_outputs[0] == "5"
    assert tool_outputs[1] == "4"
    assert "unknown tool 'multiply'" in tool_outputs[2]
    assert "bad arguments" in tool_outputs[3]
    result = env.compute_reward(messages, sample, state)
    assert result.total_reward == 1.0
    m = result.sample_metrics
    assert all(k in m for k in TOOL_METRIC_KEYS)
    assert m["total_tool_calls"] == 4 and m["tool_success_count"] == 2 and m["tool_error_count"] == 2
    assert m["tool_success_rate"] == 0.5 and m["unique_tools_used"] == 2
    assert m["add_calls"] == 2 and m["subtract_calls"] == 1


def test_wrong_final_answer_scores_zero() -> None:
    env = CalculatorEnvironment(dataset_name=str(DATA / "calculator.jsonl"))
    sample = env.load_dataset()[1]  # 10 - 7 = 3
    state = env.initial_state(sample)
    messages = [*env.format_prompt(sample), {"role": "assistant", "content": "<answer>17</answer>"}]
    state.turn = 1
    assert env.is_done(messages, state)
    result = env.compute_reward(messages, sample, state)
    assert result.total_reward == 0.0 and result.sample_metrics["total_tool_calls"] == 0


def _tool_events(reply: str) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The ``tool.call`` events of the environment's response to ``reply``, and the rollout's tool metrics."""
    from telescope.api import events

    env = CalculatorEnvironment(dataset_name=str(DATA / "calculator.jsonl"))
    sample = env.load_dataset()[0]
    state = env.initial_state(sample)
    messages = [*env.format_prompt(sample), {"role": "assistant", "content": reply}]
    seen: list[dict[str, Any]] = []
    unsubscribe = events.subscribe(seen.append)
    try:
        env.env_response(messages, state)
    finally:
        unsubscribe()
    return [e for e in seen if e["kind"] == "tool.call"], env.get_tool_metrics(state)


def test_tool_calls_are_timed_events() -> None:
    (event,), _ = _tool_events(call("add", a=1, b=2))
    assert event["tool"] == "add" and event["ok"] is True and isinstance(event["duration_s"], float)


def test_a_refused_call_is_an_event_too() -> None:
    seen, metrics = _tool_events(call("add", a=1) + call("divide", a=1, b=2) + "<tool_call>{not json</tool_call>")
    recorded = [(e["tool"], e["ok"], str(e["error"]).split(":")[0]) for e in seen]
    assert recorded == [
        ("add", False, "bad arguments for add"),
        ("divide", False, "unknown tool 'divide'; available"),
        ("<malformed>", False, "the tool call is not valid JSON"),
    ]
    assert metrics["total_tool_calls"] == len(recorded)
