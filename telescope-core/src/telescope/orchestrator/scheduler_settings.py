"""What the rollout scheduler reads of the run's config, taken once when it is built (frozen)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from telescope.schema.config import TelescopeConfig


@dataclass(frozen=True)
class SchedulerSettings:
    """What the scheduler reads of the run's config, taken once when it is built."""

    group_size: int
    batch_size: int
    first_finished: bool
    lane_capacity: int
    individual_lanes: bool
    free_lane_after_generation: bool
    max_async_rollout: int
    discard_group_zero_advantage: bool
    episode_server_affinity: bool
    max_consecutive_zero_advantage_batches: int
    max_consecutive_errored_batches: int
    seed: int

    @classmethod
    def from_config(cls, config: TelescopeConfig) -> SchedulerSettings:
        return cls(
            group_size=config.group_size,
            batch_size=config.prompts_batch_size_for_trainer,
            first_finished=config.batch_assembly == "first_finished",
            lane_capacity=config.max_concurrent_prompts_per_server,
            individual_lanes=config.enable_individual_sample_lanes,
            free_lane_after_generation=config.free_lane_after_generation,
            max_async_rollout=config.max_async_rollout,
            discard_group_zero_advantage=config.discard_group_zero_advantage,
            episode_server_affinity=config.episode_server_affinity,
            max_consecutive_zero_advantage_batches=config.max_consecutive_zero_advantage_batches,
            max_consecutive_errored_batches=config.max_consecutive_errored_batches,
            seed=config.seed,
        )
