"""Agent programs no one here wrote, trained unchanged: the OpenAI Agents SDK, and tools served over MCP.

Each program is the SDK's own ``Agent`` run by its ``Runner`` with the episode's client
(``OpenAIChatCompletionsModel``); the policy is scripted (the tiny model cannot be made
to call a tool), so the test chooses the tool call and checks what the SDK did with it
and what the episode recorded.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from telescope.api.agent import AgentEnvironment
from telescope.api.records import Sample, TrainingSample
from telescope.models.tiny import PRESETS, build_tokenizer

from .agent_helpers import SAMPLE, ScriptedPolicy, run_episode

agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK: pip install 'telescope-core[agents]'")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(PRESETS["test"])


calls_made: list[tuple[int, int]] = []


@agents.function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    calls_made.append((a, b))
    return a + b


class AgentsSdkCalculator(AgentEnvironment):
    """An Agents-SDK program: an ``Agent`` with a function tool, run by ``Runner``."""

    name = "agents_sdk"

    def load_dataset(self) -> list[Sample]:
        return [SAMPLE]

    async def run(self, client: Any, sample: Sample) -> float:
        agent = agents.Agent(
            name="calculator",
            instructions="Use the add tool, then answer with the number.",
            tools=[add],
            model=agents.OpenAIChatCompletionsModel(model="policy", openai_client=client),
        )
        result = await agents.Runner.run(agent, str(sample.prompt), run_config=agents.RunConfig(tracing_disabled=True))
        return 1.0 if str(sample.answer) in str(result.final_output) else 0.0


def test_an_agents_sdk_program_trains_unchanged(tokenizer: Any) -> None:
    calls_made.clear()
    policy = ScriptedPolicy(tokenizer, ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "5"])
    rollout = run_episode(tokenizer, AgentsSdkCalculator(), policy)
    assert rollout.error is None, rollout.error
    assert calls_made == [(2, 3)]  # the SDK ran its tool on the parsed call
    assert rollout.reward is not None and rollout.reward.total_reward == 1.0
    first = tokenizer.decode(policy.prompts[0])
    assert "Use the add tool" in first and '"name": "add"' in first  # instructions and the tool's schema
    assert "<|im_start|>tool\n5<|im_end|>" in tokenizer.decode(policy.prompts[1])
    # the SDK sends the history back; the episode continued it on the recorded tokens: one sample
    assert len(rollout.sequences) == 1 and len(rollout.turns) == 2
    (sample,) = TrainingSample.all_from_rollout(rollout, 1.0)
    assert sum(sample.loss_mask) == sum(len(t.output_token_ids) for t in rollout.turns)


class McpCalculator(AgentEnvironment):
    """An Agents-SDK program whose tools come from an MCP server (the ``mcp`` SDK, over stdio)."""

    name = "mcp_agent"

    def load_dataset(self) -> list[Sample]:
        return [Sample(prompt="multiply 6 and 7", answer=42, sample_id="1")]

    async def run(self, client: Any, sample: Sample) -> float:
        from agents.mcp import MCPServerStdio

        script = str(Path(__file__).with_name("mcp_calculator.py"))
        params = {"command": sys.executable, "args": [script]}
        async with MCPServerStdio(params=params, client_session_timeout_seconds=30) as server:  # type: ignore[arg-type]
            agent = agents.Agent(
                name="calculator",
                instructions="Use the tools.",
                mcp_servers=[server],
                model=agents.OpenAIChatCompletionsModel(model="policy", openai_client=client),
            )
            result = await agents.Runner.run(
                agent, str(sample.prompt), run_config=agents.RunConfig(tracing_disabled=True)
            )
        return 1.0 if str(sample.answer) in str(result.final_output) else 0.0


def test_tools_served_over_mcp_are_listed_and_called(tokenizer: Any) -> None:
    policy = ScriptedPolicy(
        tokenizer, ['<tool_call>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</tool_call>', "42"]
    )
    sample = McpCalculator().load_dataset()[0]
    rollout = run_episode(tokenizer, McpCalculator(), policy, sample=sample)
    assert rollout.error is None, rollout.error
    assert '"name": "multiply"' in tokenizer.decode(policy.prompts[0])  # the MCP server's tool, listed
    assert "<|im_start|>tool\n42<|im_end|>" in tokenizer.decode(policy.prompts[1])  # and called, its result read
    assert rollout.reward is not None and rollout.reward.total_reward == 1.0
    assert len(rollout.sequences) == 1
