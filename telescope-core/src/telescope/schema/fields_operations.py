"""Operating a run: checkpoints, faults, evals, the standalone eval, logging.

Each class is one section of the reference documentation (:mod:`telescope.schema.sections`);
:class:`~telescope.schema.config.TelescopeConfig` composes them.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from telescope.schema.entries import MAX_ENTRIES, CheckpointEntry, EvalEntry
from telescope.schema.sections import SectionFields
from telescope.schema.types import DEFAULT_CODE_EXCLUDES


class CheckpointingFields(SectionFields):
    """The fields of the 'checkpointing' section."""

    section: ClassVar[str] = "checkpointing"

    checkpoint_every: int = Field(0, ge=0, description="Save every N steps. 0 or false to disable")
    checkpoint_save_training_state: bool = Field(
        True, description="Include optimizer/scheduler state for resume. false = weights-only"
    )
    resume_from_checkpoint: bool | int = Field(
        False, description="true = resume from latest; integer = resume from that step"
    )
    checkpoint_dir: str | None = Field(
        None,
        description="Checkpoint path. null = RUN_DIR/checkpoints. telescope eval: the folder whose step_N "
        "checkpoints it evaluates",
    )
    checkpoint_keep_last: int | None = Field(None, ge=1, description="Keep only the N most recent checkpoints")
    checkpoint_keep_every: int | None = Field(None, ge=1, description="Always keep checkpoints at these step multiples")


class FaultToleranceFields(SectionFields):
    """The fields of the 'fault tolerance' section."""

    section: ClassVar[str] = "fault tolerance"

    inference_request_timeout_s: float | None = Field(
        1800.0,
        gt=0,
        description="Read timeout of every HTTP request to an inference server (completions, weight updates), "
        "in seconds: a request with no answer in this time fails, and a completion's rollout is errored and "
        "counted in timeouts/inference_request/count. null = wait forever",
    )
    reward_timeout_s: float | None = Field(
        600.0,
        gt=0,
        description="Seconds an environment's compute_reward may take: past it the rollout is errored (reward 0, "
        "counted in timeouts/reward/count) and the run goes on. null = no limit",
    )
    environment_step_timeout_s: float | None = Field(
        600.0,
        gt=0,
        description="Seconds one step of a multi-turn environment (env_response with its tool calls and "
        "sandboxes, is_done) may take: past it the rollout is errored (counted in "
        "timeouts/environment_step/count) and the run goes on. null = no limit",
    )
    max_consecutive_zero_advantage_batches: int = Field(
        20,
        ge=0,
        description="Fail the run, saying why, when this many batches' worth of groups in a row "
        "(N x prompts_batch_size_for_trainer) were discarded as zero-advantage: no batch can be formed. "
        "0 = wait forever",
    )
    max_consecutive_errored_batches: int = Field(
        3,
        ge=0,
        description="Fail the run with the environment's own error (exception, message, where it was raised) "
        "when this many batches' worth of groups in a row (N x prompts_batch_size_for_trainer) had every "
        "rollout errored (a reward or environment step that always raises or times out): no batch can be "
        "formed. 0 = wait forever",
    )
    watchdog_timeout_s: float = Field(
        1800.0,
        ge=0,
        description="Fail the run when nothing progresses for this many seconds (no request, reward, group, "
        "training step, weight load or eval finishes), naming the stuck component (inference server, trainer "
        "rank, environment call, sandbox) in status.json and the log. 0 = no watchdog",
    )
    inference_health_check_interval_s: float = Field(
        2.0,
        ge=0,
        description="Seconds between health checks of each inference server: one that died or stopped "
        "answering is restarted on its placement with the current weights, and its groups are re-dispatched. "
        "0 = no checks and no restarts",
    )
    inference_max_restarts: int = Field(
        3, ge=0, description="Restarts allowed per inference server; one more failure fails the run"
    )
    trainer_max_restarts: int = Field(
        2,
        ge=0,
        description="Times the trainer group restarts from the last checkpoint when a rank dies (needs "
        "checkpoint_every > 0); once exhausted, or with no checkpoint, the run fails and prints the command "
        "that resumes it",
    )


class EvalsFields(SectionFields):
    """The fields of the 'evals' section."""

    section: ClassVar[str] = "evals"

    eval_before_training: bool = Field(True, description="Run evaluations before training starts")
    eval_after_training: bool = Field(True, description="Run evaluations after training ends")
    eval_num_servers: int = Field(
        1, ge=0, description="Inference servers reserved for periodic evals. 0 = no periodic evals during training"
    )
    eval_start_end_use_all_servers: bool = Field(True, description="Use all inference servers for start/end evals")
    evals: list[EvalEntry] = Field(default_factory=list, max_length=MAX_ENTRIES, description="Evals to run")


class StandaloneEvalFields(SectionFields):
    """The fields of the 'standalone eval' section."""

    section: ClassVar[str] = "standalone eval"

    checkpoints: list[CheckpointEntry] = Field(
        default_factory=list,
        description="telescope eval: checkpoints to evaluate, [{path, step}]; with checkpoint_dir both are "
        "evaluated, this list winning on a step they share",
    )
    hf_weights: bool = Field(
        False,
        description="telescope eval: the checkpoints are Hugging Face model folders (config.json and weights, "
        "e.g. written by telescope convert-checkpoint); false = native checkpoints (step_N/ with meta.json)",
    )
    max_concurrent_samples_per_server: int = Field(
        256, ge=1, description="telescope eval: the most samples (rollouts) in flight on one inference server"
    )
    wandb_run_path: str | None = Field(
        None,
        description='telescope eval: the W&B run to log each checkpoint\'s metrics into, "entity/project/run_id" '
        "(resumed if it exists, else created); null = no W&B",
    )


class LoggingFields(SectionFields):
    """The fields of the 'logging' section."""

    section: ClassVar[str] = "logging"

    wandb_run_name: str = Field(
        "telescope_run",
        description="W&B run name, also the run directory's (unset in the config: WANDB_NAME names the W&B run)",
    )
    system_metrics_collection_interval_seconds: float = Field(
        1.0, gt=0, description="Seconds between system metric samples (CPU, memory, disk, network, GPUs) of each node"
    )
    torch_memory_sample_interval_seconds: float = Field(
        0.1, gt=0, description="Seconds between PyTorch memory samples in each trainer rank"
    )
    event_tail_window_seconds: int = Field(60, ge=1, description="Tail window for event aggregation")
    event_block_duration_seconds: int = Field(1800, ge=1, description="Duration of event blocks")
    event_upload_interval_seconds: int = Field(5, ge=1, description="Event upload interval")
    metrics_logger_interval_seconds: float = Field(
        2.0, gt=0, description="Seconds between scrapes of each inference server's Prometheus metrics"
    )
    ray_torch_memory_drain_interval_seconds: float = Field(
        0.5, gt=0, description="Seconds between collections of the trainer ranks' PyTorch memory samples"
    )
    rollout_block_size: int = Field(500, ge=1, description="Block size for rollout event grouping")
    track_gpu_events: bool = Field(
        True, description="Record the trainer's phases per rank as timeline events (CUDA events on a GPU)"
    )
    wandb_code_max_file_size_mb: float = Field(
        2.0, gt=0, description="Max file size for the code snapshot (run directory's code/ and W&B)"
    )
    wandb_code_exclude_patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_CODE_EXCLUDES),
        description="Glob patterns to exclude from the code snapshot (run directory's code/ and W&B)",
    )
