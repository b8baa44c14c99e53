"""The run's shape: general, model, environments, workers and the orchestrator's loop.

Each class is one section of the reference documentation (:mod:`telescope.schema.sections`);
:class:`~telescope.schema.config.TelescopeConfig` composes them.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from telescope.schema.entries import MAX_ENTRIES, EnvironmentEntry
from telescope.schema.sections import SectionFields
from telescope.schema.types import Dtype


class GeneralFields(SectionFields):
    """The fields of the 'general' section."""

    section: ClassVar[str] = "general"

    debug: bool = Field(False, description="Enable debug mode (DEBUG-level run logs, tracebacks on the terminal)")
    seed: int = Field(
        0, ge=0, le=2**32 - 1, description="Seed for prompt sampling, generation and initialisation (0 to 2^32 - 1)"
    )
    run_dir: str | None = Field(None, description="Run directory (local run store). null = runs/<wandb_run_name>")


class ModelFields(SectionFields):
    """The fields of the 'model' section."""

    section: ClassVar[str] = "model"

    model: str = Field("Qwen/Qwen2.5-3B", description="HuggingFace model identifier or local path")
    model_dtype: Dtype = Field("float32", description="Model weight precision")
    mixed_precision_dtype: Dtype | None = Field(
        "bfloat16",
        description="Trainer mixed precision compute dtype (fsdp: parameters cast for the forward and backward, "
        "float32 gradient reduction; megatron: model parameters in this dtype, the optimizer steps "
        "megatron_main_params_dtype copies). null to disable",
    )
    warm_start_steps: int = Field(
        0, ge=0, description="Supervised steps on the environments' demonstrations before RL (0 = none)"
    )
    warm_start_learning_rate: float = Field(1.0e-3, gt=0, description="Learning rate of the warm start")
    warm_start_batch_size: int = Field(32, ge=1, description="Demonstrations per warm-start step")


class EnvironmentsFields(SectionFields):
    """The fields of the 'environments' section."""

    section: ClassVar[str] = "environments"

    environments: list[EnvironmentEntry] = Field(
        default_factory=list, max_length=MAX_ENTRIES, description="Training environments (at least one)"
    )


class WorkersFields(SectionFields):
    """The fields of the 'workers' section."""

    section: ClassVar[str] = "workers"

    inference_num_workers: int = Field(
        2, ge=1, description="Number of inference workers. Must be divisible by inference_tensor_parallel_size"
    )
    inference_tensor_parallel_size: int = Field(1, ge=1, description="Tensor parallelism degree per inference server")
    trainer_num_workers: int = Field(2, ge=1, description="Number of FSDP/Megatron trainer workers")


class OrchestratorFields(SectionFields):
    """The fields of the 'orchestrator' section."""

    section: ClassVar[str] = "orchestrator"

    max_concurrent_prompts_per_server: int = Field(32, ge=1, description="Max concurrent prompts per inference server")
    prompts_batch_size_for_trainer: int = Field(16, ge=1, description="Number of prompt groups per training batch")
    number_of_steps: int = Field(300, ge=1, description="Total training steps")
    max_async_rollout: int = Field(
        2, ge=0, description="How many training steps inference can run ahead. 0 = fully synchronous"
    )
    discard_group_zero_advantage: bool = Field(
        True, description="Drop groups where all samples got identical rewards (no learning signal)"
    )
    enable_prompt_prefetch: bool = Field(True, description="Prefetch prompts from the dataset")
    prompt_prefetch_buffer_size: int = Field(24, ge=1, description="Number of prompts to prefetch")
    enable_individual_sample_lanes: bool = Field(
        True, description="Each sample gets its own lane slot instead of one per group"
    )
    free_lane_after_generation: bool = Field(
        True,
        description="Free the inference lane after generation, before reward computation. "
        "Requires enable_individual_sample_lanes",
    )
    episode_server_affinity: bool = Field(
        True,
        description="Every request of an episode (each turn, each agent call) goes to its group's server, where its "
        "earlier requests' prefix is cached; false: each request goes to the least busy training server",
    )
    max_off_policy_steps: int = Field(
        8,
        ge=1,
        description="Staleness bound: a token produced more than this many weight updates before the step that "
        "trains it is stale (see stale_token_policy); in-flight groups dispatched that long ago are cancelled "
        "unless continue_requests_across_updates",
    )
    stale_token_policy: Literal["drop_episode", "mask"] = Field(
        "drop_episode",
        description='"drop_episode": an episode with a stale token is discarded (max_async); "mask": its stale '
        "tokens get no loss and the rest trains (discarded only when every token is stale)",
    )
    continue_requests_across_updates: bool = Field(
        False,
        description="In-flight requests keep generating with the new weights at a weight update instead of being "
        "cancelled when stale (each token keeps the version that produced it). Requires stale_token_policy: mask",
    )
    batch_assembly: Literal["first_finished", "deterministic"] = Field(
        "first_finished",
        description='"first_finished": a batch takes the first groups to finish (no waiting for stragglers); '
        '"deterministic": each group is bound to a step and its batch waits for it (reproducible)',
    )
    eager_prepare_resources: bool = Field(
        False,
        description="Call every training environment's prepare_resources() (e.g. warm its sandbox pool) before "
        "the first rollout; false = environments prepare lazily, on first use",
    )
