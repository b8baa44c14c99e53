"""miniwob_agent: MiniWoB++ driven by plain ``openai`` SDK code with function tools, through the gateway.

The agent kit drives the program with scripted replies (the tool calls in the model's
markup, which the gateway turns into ``tool_calls``); the tests below check that the
program acts on the page through the tools, answers each call with a ``tool`` message of
the new page, and scores as ``miniwob`` does. Skips without Chromium, Playwright, miniwob
or openai.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from telescope.testing.agent import AgentEnvironmentConformance, ScriptedPolicy, run_episodes, tiny_tokenizer

pytest.importorskip("playwright", reason="pip install playwright")
pytest.importorskip("miniwob", reason="pip install 'telescope-envs[browser]'")
pytest.importorskip("openai", reason="pip install 'telescope-core[agents]'")
CHROMIUM = os.environ.get("TELESCOPE_CHROMIUM", "/usr/bin/chromium")
pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium is not installed (apt-get install chromium)"),
    pytest.mark.timeout(300),
]

from telescope_envs.miniwob_agent import MiniWoBAgentEnvironment  # noqa: E402 (after the skips)
from telescope_envs.miniwob_scripts import call  # noqa: E402


class TestMiniWoBAgentConformance(AgentEnvironmentConformance):
    def environment_factory(self) -> MiniWoBAgentEnvironment:
        return MiniWoBAgentEnvironment(tasks=["click-button"], samples_per_task=3)


def test_the_program_acts_through_function_tools_and_scores_the_tasks_reward() -> None:
    tokenizer = tiny_tokenizer()
    environment = MiniWoBAgentEnvironment(tasks=["click-checkboxes"], samples_per_task=2)
    try:
        sample = environment.load_dataset()[0]
        replies = environment.demonstration_replies(sample)
        assert replies is not None and replies[0].count("<tool_call>") >= 1
        solved_policy = ScriptedPolicy(tokenizer, replies)
        bad_policy = ScriptedPolicy(tokenizer, [call("click", ref=999) + call("press", key="F13"), "done"])
        solved, bad = asyncio.run(run_episodes(tokenizer, environment, [(sample, solved_policy), (sample, bad_policy)]))
    finally:
        environment.close()
    assert solved.error is None and solved.reward is not None and solved.reward.total_reward > 0.5
    assert solved.reward.sample_metrics["success"] == 1.0
    assert solved.reward.sample_metrics["actions"] == replies[0].count("<tool_call>")
    assert len(solved.agent_calls) == 1  # the task ended with the first reply's actions
    first_prompt = tokenizer.decode(solved_policy.prompts[0])
    assert "Task: Select" in first_prompt and '"name": "click"' in first_prompt  # the page and the tool schemas
    # the bad calls are answered with errors in tool messages; the second call sees them and the episode scores 0
    assert bad.error is None and bad.reward is not None and bad.reward.total_reward == 0.0
    second_prompt = tokenizer.decode(bad_policy.prompts[1])
    assert "no element numbered 999" in second_prompt and "press takes one of" in second_prompt
    assert bad.reward.sample_metrics["actions"] == 2.0


def test_the_sample_ids_are_the_agents_own_and_the_run_context_reaches_the_pages() -> None:
    from telescope.api.context import EnvironmentContext
    from telescope.api.environment import bind_context

    environment = MiniWoBAgentEnvironment(tasks=["click-button"], samples_per_task=2)
    ids = [s.sample_id for s in environment.load_dataset()]
    assert ids == ["miniwob_agent-click-button-0", "miniwob_agent-click-button-1"]
    bind_context(environment, EnvironmentContext(browser_provider="elsewhere"))
    assert environment._bound_pages().provider_name == "elsewhere"


def test_arguments_that_are_not_json_are_answered_with_an_error() -> None:
    from telescope_envs.miniwob_agent import _tool_call

    assert _tool_call("click", '{"ref": 2}').arguments == {"ref": 2}
    broken: Any = _tool_call("click", "{ref: 2")
    assert broken.error is not None and "not JSON" in broken.error
    assert "JSON object" in str(_tool_call("click", "[1]").error)


def test_a_conversation_that_outgrows_the_context_is_scored_not_errored() -> None:
    tokenizer = tiny_tokenizer()
    environment = MiniWoBAgentEnvironment(tasks=["click-button"], samples_per_task=1, max_actions=16)
    try:
        sample = environment.load_dataset()[0]
        looping = ScriptedPolicy(tokenizer, [call("press", key="F13")])  # a bad call, again and again
        (rollout,) = asyncio.run(run_episodes(tokenizer, environment, [(sample, looping)], max_model_len=1400))
    finally:
        environment.close()
    assert rollout.error is None and rollout.reward is not None and rollout.reward.total_reward == 0.0
    assert rollout.reward.sample_metrics["context_full"] == 1.0
    assert 1 <= rollout.reward.sample_metrics["actions"] < 16
