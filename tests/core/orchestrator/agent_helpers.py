"""Shared pieces of the agent-episode tests: one episode with a scripted policy (the kit's)."""

from __future__ import annotations

import asyncio
from typing import Any

from telescope.api.agent import AgentEnvironment
from telescope.api.records import Rollout, Sample
from telescope.testing.agent import ScriptedPolicy, run_episodes

SAMPLE = Sample(prompt="add 2 and 3", answer=5, sample_id="0", environment="calc")

__all__ = ["SAMPLE", "ScriptedPolicy", "run_episode"]


def run_episode(
    tokenizer: Any, environment: AgentEnvironment, policy: ScriptedPolicy, sample: Sample = SAMPLE, max_tokens: int = 96
) -> Rollout:
    """One episode of ``environment`` through a gateway started for it."""
    (rollout,) = asyncio.run(
        run_episodes(tokenizer, environment, [(sample, policy)], max_tokens=max_tokens, max_model_len=1024)
    )
    return rollout
