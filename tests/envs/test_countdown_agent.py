"""countdown_agent: an Agents SDK program whose target is behind a tool, checked by the agent kit.

The kit drives the program through the gateway with scripted replies; the tests below
check what is particular to it: the tool is what reveals the target (an answer without
asking scores no more than format), and the registered name resolves.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from telescope.testing.agent import AgentEnvironmentConformance, ScriptedPolicy, run_episodes, tiny_tokenizer

pytest.importorskip("agents", reason="the OpenAI Agents SDK: pip install 'telescope-core[agents]'")

from telescope_envs.countdown_agent import TARGET_CALL, CountdownAgentEnvironment


class TestCountdownAgentConformance(AgentEnvironmentConformance):
    def environment_factory(self) -> CountdownAgentEnvironment:
        return CountdownAgentEnvironment(num_samples=20)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return tiny_tokenizer()


def test_the_tool_reveals_the_target_and_a_solution_scores_full(tokenizer: Any) -> None:
    environment = CountdownAgentEnvironment(num_samples=20)
    sample = environment.load_dataset()[0]
    replies = environment.demonstration_replies(sample)
    assert replies is not None and replies[0] == TARGET_CALL
    policy = ScriptedPolicy(tokenizer, replies)
    (rollout,) = asyncio.run(run_episodes(tokenizer, environment, [(sample, policy)]))
    assert rollout.reward is not None and rollout.reward.total_reward == 2.0
    assert rollout.reward.sample_metrics["asked_target"] == 1.0
    target = str(sample.answer["target"])
    assert f"<|im_start|>tool\n{sample.prompt} -> {target}<|im_end|>" in tokenizer.decode(policy.prompts[1])
    assert target not in tokenizer.decode(policy.prompts[0]).split("<|im_start|>user\n")[1]  # not in the prompt
    assert len(rollout.sequences) == 1 and len(rollout.turns) == 2  # the two calls train as one sequence


def test_a_broken_call_and_a_run_out_of_turns_are_scored_not_errored(tokenizer: Any) -> None:
    environment = CountdownAgentEnvironment(num_samples=20, max_turns=2)
    sample = environment.load_dataset()[0]
    wrong = f"<answer>{' + '.join(map(str, sample.answer['nums']))} + 100</answer>"
    looping = ScriptedPolicy(tokenizer, [TARGET_CALL])  # asks forever: max_turns ends it
    answered, looped = asyncio.run(
        run_episodes(tokenizer, environment, [(sample, ScriptedPolicy(tokenizer, [wrong])), (sample, looping)])
    )
    # the forced call's arguments broken by an answer: no tool ran, the answer scores its format only
    assert answered.reward is not None and answered.reward.total_reward == 1.0
    assert answered.reward.sample_metrics["asked_target"] == 0.0
    assert looped.error is None and looped.reward is not None and looped.reward.total_reward == 0.0
    assert len(looped.agent_calls) == 2


def test_bad_arguments_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="max_turns must be at least 2"):
        CountdownAgentEnvironment(max_turns=1)
