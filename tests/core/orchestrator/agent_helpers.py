"""Shared pieces of the agent-episode tests: a scripted policy and a gateway in the test's loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from telescope.api.agent import AgentEnvironment
from telescope.api.records import Rollout, Sample
from telescope.orchestrator.agent_gateway import AgentGateway, run_agent_episode
from telescope.orchestrator.rollouts import Generation, RolloutLimits

SAMPLE = Sample(prompt="add 2 and 3", answer=5, sample_id="0", environment="calc")


class ScriptedPolicy:
    """A ``generate`` that answers call ``i`` with ``replies[i]`` (text, or a function of the prompt's text).

    The tiny model is random and cannot be made to call a tool; a scripted policy answers the
    tokens of chosen text followed by the end-of-turn token, as a model that stops does, and
    reports each token at ``version``. It keeps every prompt it was given.
    """

    def __init__(self, tokenizer: Any, replies: list[str | Callable[[str], str]], version: int = 0) -> None:
        self.tokenizer = tokenizer
        self.replies = replies
        self.version = version
        self.prompts: list[list[int]] = []
        self.delay_s = 0.0

    async def __call__(self, prompt_ids: list[int], max_tokens: int, turn: int) -> Generation:
        self.prompts.append(list(prompt_ids))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        reply = self.replies[min(turn, len(self.replies) - 1)]
        text = reply(self.tokenizer.decode(prompt_ids)) if callable(reply) else reply
        ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id][:max_tokens]
        return Generation(ids, [-0.5] * len(ids), "stop", self.version, self.version, [self.version] * len(ids))


def run_episode(
    tokenizer: Any, environment: AgentEnvironment, policy: ScriptedPolicy, sample: Sample = SAMPLE, max_tokens: int = 96
) -> Rollout:
    """One episode of ``environment`` through a gateway started for it."""

    async def go() -> Rollout:
        gateway = await AgentGateway(tokenizer, chat_template=None, max_model_len=1024, model_name="policy").start()
        try:
            return await run_agent_episode(
                environment,
                sample,
                gateway=gateway,
                generate=policy,
                policy_version=lambda: policy.version,
                limits=RolloutLimits(max_tokens, 1024),
            )
        finally:
            await gateway.close()

    return asyncio.run(go())
