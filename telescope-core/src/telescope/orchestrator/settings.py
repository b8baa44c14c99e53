"""What the orchestrator's components read of the run's config: frozen settings, taken once.

The orchestrator is built from the validated config (:mod:`telescope.orchestrator.assembly`);
it and its scheduler read only these objects afterwards, so what they depend on is
named here, typed, and cannot change under them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from telescope.api.context import EnvironmentContext
from telescope.orchestrator.filters import OutputChecks
from telescope.orchestrator.rollouts import RolloutLimits
from telescope.orchestrator.staleness import Staleness

if TYPE_CHECKING:
    from telescope.schema.config import TelescopeConfig
    from telescope.schema.entries import EvalEntry


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
    limits: RolloutLimits
    staleness: Staleness
    checks: OutputChecks

    @classmethod
    def from_config(cls, config: TelescopeConfig, vocab_size: int) -> SchedulerSettings:
        """``vocab_size``: the tokenizer's, which the gibberish filter reads."""
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
            limits=RolloutLimits.from_config(config),
            staleness=Staleness.from_config(config),
            checks=OutputChecks.from_config(config, vocab_size),
        )


@dataclass(frozen=True)
class OrchestratorSettings:
    """What the orchestrator's loop reads of the run's config."""

    number_of_steps: int
    warm_start_steps: int
    warm_start_batch_size: int
    warm_start_learning_rate: float
    seed: int
    temperature: float
    top_p: float | None
    watchdog_timeout_s: float
    trainer_max_restarts: int
    eager_prepare_resources: bool
    model: str
    chat_template: str | None
    max_model_len: int
    evals: tuple[EvalEntry, ...]
    eval_num_servers: int
    eval_before_training: bool
    eval_after_training: bool
    eval_start_end_use_all_servers: bool

    @classmethod
    def from_config(cls, config: TelescopeConfig) -> OrchestratorSettings:
        return cls(
            number_of_steps=config.number_of_steps,
            warm_start_steps=config.warm_start_steps,
            warm_start_batch_size=config.warm_start_batch_size,
            warm_start_learning_rate=config.warm_start_learning_rate,
            seed=config.seed,
            temperature=config.temperature,
            top_p=config.top_p,
            watchdog_timeout_s=config.watchdog_timeout_s,
            trainer_max_restarts=config.trainer_max_restarts,
            eager_prepare_resources=config.eager_prepare_resources,
            model=config.model,
            chat_template=config.chat_template,
            max_model_len=config.max_model_len,
            evals=tuple(config.evals),
            eval_num_servers=config.eval_num_servers,
            eval_before_training=config.eval_before_training,
            eval_after_training=config.eval_after_training,
            eval_start_end_use_all_servers=config.eval_start_end_use_all_servers,
        )


@dataclass(frozen=True)
class EvalSettings:
    """What the eval runner reads of the run's config; an eval entry's own values override the sampling."""

    evals: tuple[EvalEntry, ...]
    seed: int
    temperature: float
    top_p: float | None
    limits: RolloutLimits
    environment_context: EnvironmentContext
    model: str
    chat_template: str | None
    max_concurrent_prompts_per_server: int

    @classmethod
    def from_config(cls, config: TelescopeConfig) -> EvalSettings:
        return cls(
            evals=tuple(config.evals),
            seed=config.seed,
            temperature=config.temperature,
            top_p=config.top_p,
            limits=RolloutLimits.from_config(config),
            environment_context=EnvironmentContext.from_config(config),
            model=config.model,
            chat_template=config.chat_template,
            max_concurrent_prompts_per_server=config.max_concurrent_prompts_per_server,
        )
