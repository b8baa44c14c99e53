"""How a run runs one episode: an environment's rollout, or an agent program's episode.

:class:`EpisodeRunner` holds what every episode of a run shares (the chat renderer, the
limits, the compactor, the agent gateway) and picks the loop by the environment's kind:
an :class:`~telescope.api.agent.AgentEnvironment` runs its program through the gateway
(:func:`~telescope.orchestrator.agent_gateway.run_agent_episode`); any other environment
runs the turn loop of :func:`~telescope.orchestrator.rollouts.run_rollout`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from telescope.api.agent import AgentEnvironment
from telescope.api.compaction import Compactor
from telescope.api.environment import EnvironmentBase
from telescope.api.records import Message, Rollout, Sample
from telescope.orchestrator.agent_gateway import AgentGateway, run_agent_episode
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.rollouts import GenerateFn, Lane, RolloutLimits, run_rollout


@dataclass(frozen=True)
class EpisodeRunner:
    """Runs episodes of any environment kind (see the module docstring)."""

    renderer: ChatRenderer
    limits: RolloutLimits
    compactor: Compactor | None = None
    agents: AgentGateway | None = None
    free_lane_after_generation: bool = True

    async def run(
        self,
        environment: EnvironmentBase,
        sample: Sample,
        messages: list[Message],
        prompt_ids: list[int],
        *,
        generate: GenerateFn,
        policy_version: Callable[[], int],
        lane: Lane | None = None,
    ) -> Rollout:
        if isinstance(environment, AgentEnvironment):
            if self.agents is None:
                raise RuntimeError(f"{type(environment).__name__} is an agent environment and the run has no gateway")
            return await run_agent_episode(
                environment,
                sample,
                gateway=self.agents,
                generate=generate,
                policy_version=policy_version,
                limits=self.limits,
                lane=lane,
                free_lane_after_generation=self.free_lane_after_generation,
            )
        return await run_rollout(
            environment,
            sample,
            messages,
            prompt_ids,
            renderer=self.renderer,
            generate=generate,
            policy_version=policy_version,
            limits=self.limits,
            lane=lane,
            free_lane_after_generation=self.free_lane_after_generation,
            compactor=self.compactor,
        )
