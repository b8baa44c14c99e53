"""The run configuration: one flat, pydantic-validated schema.

Every field name is globally unique and says what it is. This module holds the
fields the core itself reads; every plugin declares the fields it reads
(:mod:`telescope.api.settings`) and the loader composes the two
(:mod:`telescope.config.composition`). The defaults of both are written out,
field for field, in ``configs/defaults/default_train.yaml`` (``telescope config
defaults`` regenerates it from what is installed; a test keeps the two equal). Unknown
keys are rejected (``extra="forbid"``). Rules that involve several fields and need
no plugin are in :mod:`telescope.config.cross_field` (run by
:meth:`TelescopeConfig._cross_field_rules`); rules that
need the plugin registry (names, algorithm capabilities) are in
:mod:`telescope.config.rules`.

Plugin-chosen fields (``algorithm``, ``train_backend``, ``inference_backend``,
``weight_transport``, ``sandbox_provider``, environment and eval names) are plain
strings checked against the registry, so that an installed package can add names.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from telescope.config.cross_field import cross_field_problems
from telescope.config.entries import MAX_ENTRIES, CheckpointEntry, EnvironmentEntry, EvalEntry

S = TypeVar("S", bound=BaseModel)
Dtype = Literal["float32", "float16", "bfloat16"]
PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]

#: What the code snapshot (the run store's, uploaded by the W&B logger) leaves out by default.
DEFAULT_CODE_EXCLUDES = [".git", ".venv", "__pycache__", "*.pyc", "runs", "wandb", "checkpoints", "node_modules"]


class TelescopeConfig(BaseModel):
    """The core's parameters of a Telescope run.

    The schema a run validates against is this class extended with the fields
    every installed plugin declares (:func:`telescope.config.composition.composed_schema`);
    code reads plugin fields through :meth:`settings`, typed by the plugin's model.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    def settings(self, model: type[S]) -> S:
        """This config's values of ``model``'s fields, as an instance of ``model`` (a typed slice).

        ``model`` is a plugin's :class:`~telescope.api.settings.PluginSettings` (or any
        model whose field names are fields of this config).
        """
        missing = [name for name in model.model_fields if name not in type(self).model_fields]
        if missing:
            raise KeyError(
                f"the config has no field(s) {', '.join(missing)} of {model.__name__}: it was loaded without "
                "the plugin that declares them (load it with telescope.config.load_config)"
            )
        return model.model_validate({name: getattr(self, name) for name in model.model_fields})

    # ------------------------------------------------------------------ general
    debug: bool = Field(False, description="Enable debug mode (DEBUG-level run logs, tracebacks on the terminal)")
    seed: int = Field(
        0, ge=0, le=2**32 - 1, description="Seed for prompt sampling, generation and initialisation (0 to 2^32 - 1)"
    )
    run_dir: str | None = Field(None, description="Run directory (local run store). null = runs/<wandb_run_name>")

    # -------------------------------------------------------------------- model
    model: str = Field("Qwen/Qwen2.5-3B", description="HuggingFace model identifier or local path")
    model_dtype: Dtype = Field("float32", description="Model weight precision")
    warm_start_steps: int = Field(
        0, ge=0, description="Supervised steps on the environments' demonstrations before RL (0 = none)"
    )
    warm_start_learning_rate: float = Field(1.0e-3, gt=0, description="Learning rate of the warm start")
    warm_start_batch_size: int = Field(32, ge=1, description="Demonstrations per warm-start step")

    # ------------------------------------------------------------- environments
    environments: list[EnvironmentEntry] = Field(
        default_factory=list, max_length=MAX_ENTRIES, description="Training environments (at least one)"
    )

    # ------------------------------------------------------------------ workers
    inference_num_workers: int = Field(
        2, ge=1, description="Number of inference workers. Must be divisible by inference_tensor_parallel_size"
    )
    inference_tensor_parallel_size: int = Field(1, ge=1, description="Tensor parallelism degree per inference server")
    trainer_num_workers: int = Field(2, ge=1, description="Number of FSDP/Megatron trainer workers")

    # ------------------------------------------------------------- orchestrator
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

    # ------------------------------------------------------------------ trainer
    learning_rate: float = Field(1.0e-6, gt=0, description="Learning rate (must be > 0)")
    weight_decay: float = Field(0.0, ge=0, description="Weight decay coefficient")
    grad_clip: float = Field(1.0, gt=0, description="Maximum gradient norm for clipping")
    lr_scheduler: Literal["none", "constant", "linear", "cosine"] = Field(
        "constant",
        description='LR schedule. "none" = fixed LR; "constant" = warmup then constant; '
        '"linear" / "cosine" = warmup then decay',
    )
    warmup_steps: int = Field(0, ge=0, description="Number of linear warmup steps")
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="Minimum LR as a fraction of learning_rate for linear/cosine decay"
    )
    train_backend: str = Field("fsdp", description='Training backend ("fsdp", "megatron" or a plugin)')

    # ---------------------------------------------------------------- algorithm
    algorithm: str = Field(
        "grpo", description="RL algorithm (grpo, rloo, reinforce_pp, dr_grpo, cispo, gspo, sapo or a plugin)"
    )
    number_of_minibatches: int = Field(1, ge=1, description="Optimizer steps per rollout batch (PPO-style)")
    advantage_norm: Literal["group", "batch"] | None = Field(
        None,
        description="Normalise advantages within each prompt group or across the training batch. "
        "null = the algorithm's default (group; batch for reinforce_pp)",
    )
    use_ppo_clip: bool = Field(False, description="Apply PPO ratio clipping. Incompatible with cispo, gspo, sapo")
    ppo_clip_ref_logprobs: Literal["rollout", "batch"] = Field(
        "rollout",
        description='Reference logprobs for ratios. "rollout" = inference logprobs; "batch" = recompute with trainer',
    )
    clip_low: float = Field(0.4, ge=0, le=1, description="Ratio lower bound is 1 - clip_low")
    clip_high: float = Field(0.5, ge=0, description="Ratio upper bound is 1 + clip_high")
    clip_ratio_c: float | None = Field(
        None,
        description="Dual-clip PPO: for negative advantages the loss is at most -clip_ratio_c * A (must be > 1). "
        "Needs use_ppo_clip or gspo. null = disabled",
    )
    use_tis: bool = Field(False, description="Truncated importance sampling for inference/trainer logprob mismatch")
    tis_cap: float = Field(2.0, gt=0, description="Max importance weight for TIS")
    tis_logprob_clamp: float = Field(20.0, gt=0, description="Logprob-difference clamp for TIS")
    tis_mode: Literal["truncate", "icepop"] = Field(
        "truncate",
        description='"truncate" = clamp IS weights to [tis_floor, tis_cap]; '
        '"icepop" = weight 0 for tokens outside [tis_floor, tis_cap]. Needs use_tis',
    )
    tis_floor: float = Field(
        0.0, ge=0, description="Lower bound of the IS weight (0 = none in truncate mode). Must be below tis_cap"
    )
    kl_penalty_tau: float = Field(
        0.0,
        ge=0,
        description="Coefficient of the per-token KL penalty against the rollout policy. 0 or null = disabled",
    )
    kl_estimator: Literal["k2", "k3"] = Field(
        "k2",
        description='KL penalty estimator: "k2" = d^2; "k3" = min(exp(d) - 1 - d, 10), with d = logprob - rollout '
        "logprob (the cap makes k3 underestimate a large drift)",
    )
    entropy_coef: float = Field(
        0.0, ge=0, description="Entropy bonus: subtract entropy_coef * entropy from the loss; 0 = disabled"
    )
    entropy_chunk_size: int = Field(1024, ge=1, description="Positions per chunk in the entropy computation")
    seq_is_masking: bool = Field(
        False, description="Drop whole sequences whose geometric-mean IS ratio falls outside [low, high]"
    )
    seq_is_mask_low: float = Field(
        0.8, gt=0, lt=1, description="Lower bound of the geometric-mean IS ratio (must be < 1; on-policy is 1)"
    )
    seq_is_mask_high: float = Field(
        1.2, gt=1, description="Upper bound of the geometric-mean IS ratio (must be > 1; on-policy is 1)"
    )

    # ------------------------------------------------- overlong and output filters
    filter_overlong: bool = Field(
        False,
        description="Mask the loss of truncated completions (finish reason length: max_tokens or max_model_len "
        "reached without EOS); they stay in their group's advantage baseline",
    )
    overlong_penalty_factor: float = Field(
        0.0,
        ge=0,
        description="DAPO's graduated length penalty: a completion longer than max_tokens - overlong_buffer_tokens "
        "loses factor * excess / overlong_buffer_tokens reward (at most factor); 0 = disabled",
    )
    overlong_buffer_tokens: int = Field(
        256, ge=1, description="Tokens before max_tokens over which the overlong penalty ramps from 0 to the factor"
    )
    filter_gibberish: bool = Field(
        False,
        description="Mask the loss of completions with a rare token (id > gibberish_token_threshold) sampled "
        "at a log-probability below -log(vocab_size) - gibberish_logprob_offset",
    )
    gibberish_token_threshold: int = Field(100000, ge=1, description="Token ids above this count as rare")
    gibberish_logprob_offset: float = Field(
        2.0, gt=0, description="A rare token is gibberish below log-probability -log(vocab_size) - this offset"
    )
    filter_repetition: bool = Field(
        False,
        description="Mask the loss of repetitive completions: zlib compression ratio of the text's last "
        "10000 characters above repetition_compression_threshold (texts under 100 characters pass)",
    )
    repetition_compression_threshold: float = Field(
        10.0, gt=1, description="Compression ratio (bytes / zlib-compressed bytes) above which a completion repeats"
    )

    # --------------------------------------------------------- rollout/sampling
    group_size: int = Field(8, ge=1, description="Number of completions sampled per prompt")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (> 0)")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus sampling probability. null = disabled")
    max_tokens: int = Field(3700, ge=1, description="Maximum generation tokens per completion (per turn)")
    interleaved_rollouts: bool = Field(
        True, description="Exact token reuse across turns (no re-tokenization in multi-turn environments)"
    )
    compaction: str = Field(
        "none",
        min_length=1,
        description='Context compaction of multi-turn episodes: "none", "summarize", "drop_tool_outputs", '
        '"sliding" or a plugin. An episode whose context reaches compaction_threshold x max_model_len goes on '
        "in a new context segment instead of ending",
    )
    compaction_threshold: float = Field(
        0.8, gt=0, lt=1, description="Share of max_model_len at which an episode's context is compacted"
    )
    compaction_instruction: str = Field(
        "Summarize the conversation so far: the task, what you have done, what you found and what remains "
        "to do. Your summary replaces the conversation, so keep every detail you still need.",
        min_length=1,
        description="What the policy is asked when compaction: summarize writes a summary of the history",
    )
    compaction_keep_turns: int = Field(
        2,
        ge=1,
        description="Turns kept verbatim by compaction: sliding keeps the last N turns, drop_tool_outputs the "
        "tool results of the last N turns",
    )

    # ------------------------------------------------------------------ packing
    seq_len: int = Field(4096, ge=1, description="Maximum sequence length for packing")
    pad_to_multiple_of: int = Field(64, ge=1, description="Pad packed sequences to this alignment")

    # --------------------------------------------------------- inference server
    inference_backend: str = Field(
        "auto",
        description='Inference backend: "embedded", "vllm" or a plugin. "auto" = vllm when usable, else embedded',
    )
    inference_host: str = Field(
        "auto",
        min_length=1,
        description='Address inference servers bind. "auto" = loopback on the orchestrator node, a node address '
        '(as Ray reports it) elsewhere; "0.0.0.0" = every interface. Servers always ask for the run token',
    )
    inference_base_port: int = Field(8100, ge=1, le=65535, description="Base port for inference servers")
    max_model_len: int = Field(4096, ge=2, description="Maximum context length (prompt + completion)")
    max_num_seqs: int | None = Field(
        None,
        ge=1,
        description="Sequences one inference server runs at once (vLLM --max-num-seqs; the embedded engine's "
        "batch). null = max_concurrent_prompts_per_server x group_size (capped at 1024 for vLLM, 256 embedded)",
    )
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        description="Tokens one inference scheduler step processes, prefill and decode (vLLM "
        "--max-num-batched-tokens; the embedded engine prefills longer prompts in chunks). null = vLLM's default; "
        "no limit in the embedded engine",
    )
    vllm_scheduling_policy: Literal["priority", "fcfs"] = Field(
        "priority", description='"priority" = turn-aware scheduling for multi-turn; "fcfs" = first-come-first-served'
    )
    enable_thinking: bool = Field(False, description="Pass enable_thinking=True to apply_chat_template()")
    chat_template: str | None = Field(None, description="Jinja2 chat template overriding the tokenizer's")

    # -------------------------------------------------------------- sandboxes
    sandbox_provider: str = Field(
        "local",
        description='Sandbox provider of every environment that runs code ("local", "e2b", ...; '
        "an environment's own sandbox_provider kwarg overrides it)",
    )

    # ------------------------------------------------------------ checkpointing
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

    # ---------------------------------------------------------- fault tolerance
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

    # -------------------------------------------------------------------- evals
    eval_before_training: bool = Field(True, description="Run evaluations before training starts")
    eval_after_training: bool = Field(True, description="Run evaluations after training ends")
    eval_num_servers: int = Field(
        1, ge=0, description="Inference servers reserved for periodic evals. 0 = no periodic evals during training"
    )
    eval_start_end_use_all_servers: bool = Field(True, description="Use all inference servers for start/end evals")
    evals: list[EvalEntry] = Field(default_factory=list, max_length=MAX_ENTRIES, description="Evals to run")

    # ---------------------------------------------------------- standalone eval
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

    # ------------------------------------------------------------------ logging
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

    # --------------------------------------------------------------------- ray
    ray_address: str = Field(
        "auto",
        description='Ray cluster address ("auto": RAY_ADDRESS or the cluster `ray start` made here; "local": private)',
    )
    ray_auto_start_local: bool = Field(
        True, description="Start a local Ray cluster, private to the run, if there is none to attach to"
    )
    ray_namespace: str = Field("telescope", description="Ray namespace")
    ray_log_to_driver: bool = Field(True, description="Forward worker logs to the driver process")
    ray_runtime_env: dict[str, Any] | None = Field(None, description="Custom Ray runtime environment")
    ray_disable_runtime_env_hook: bool = Field(True, description="Disable Ray's runtime environment hook")
    ray_pin_py_executable: bool = Field(True, description="Pin the Python executable path in workers")
    ray_propagate_active_venv: bool = Field(True, description="Propagate the active virtualenv to workers")
    ray_propagate_run_dir: bool = Field(
        True, description="Propagate the run directory to workers (true only: every worker is given it)"
    )
    ray_worker_keep_freed_memory: bool = Field(
        True,
        description="Workers keep the memory they free for their next allocations (glibc malloc: "
        "MALLOC_MMAP_THRESHOLD_=1 GiB, MALLOC_TRIM_THRESHOLD_=1 TiB) instead of returning it to the OS and faulting "
        "it in again every step; values set in ray_runtime_env's env_vars or in the environment win (a private "
        "cluster's own processes get them too: its workers inherit them from the environment it starts in)",
    )
    ray_broadcast_init_timeout_s: int = Field(300, ge=1, description="Timeout for weight broadcast initialization")
    ray_broadcast_prefer_loopback_if_single_node: bool = Field(
        True, description="Prefer the loopback interface for single-node broadcasts"
    )
    ray_shutdown_on_exit: bool = Field(False, description="Shut down the Ray cluster on exit")
    ray_inference_cpus_per_worker: float = Field(4.0, gt=0, description="CPU cores per inference worker")
    ray_trainer_cpus_per_worker: float = Field(4.0, gt=0, description="CPU cores per trainer worker")
    ray_inference_placement_strategy: PlacementStrategy = Field("PACK", description="Placement of inference workers")
    ray_trainer_placement_strategy: PlacementStrategy = Field("PACK", description="Placement of trainer workers")
    ray_inference_resources_per_worker: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources per inference worker, e.g. {node_b: 1}: servers go to nodes that offer them",
    )
    ray_trainer_resources_per_worker: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources per trainer worker, e.g. {node_a: 1}: ranks go to nodes that offer them",
    )
    ray_placement_timeout_s: int = Field(900, ge=1, description="Timeout for placement group creation")

    # ------------------------------------------------------- weight broadcasting
    weight_transport: str = Field(
        "auto", description='Weight transport ("memory", "nccl" or a plugin). "auto" = nccl on GPU, memory on CPU'
    )
    weight_broadcast_free_grad_buffers: bool = Field(
        True,
        description="Free gradient buffers during broadcast (true only: the trainers free the gradients "
        "after every optimizer step)",
    )

    # ---------------------------------------------------------------- validators

    @field_validator("checkpoint_every", mode="before")
    @classmethod
    def _checkpoint_every_bool(cls, value: Any) -> Any:
        if value is False or value is None:
            return 0
        if value is True:
            raise ValueError("checkpoint_every takes a step count (e.g. 50), or 0/false to disable")
        return value

    @field_validator("ray_inference_resources_per_worker", "ray_trainer_resources_per_worker")
    @classmethod
    def _custom_resources(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(
                    f"{name!r} is set by ray_*_cpus_per_worker and the GPU settings; list only custom resources "
                    "(the names given to `ray start --resources`)"
                )
            if amount <= 0:
                raise ValueError(f"resource {name!r} needs an amount > 0, got {amount}")
        return value

    @field_validator("checkpoints")
    @classmethod
    def _one_checkpoint_per_step(cls, value: list[CheckpointEntry]) -> list[CheckpointEntry]:
        steps = [entry.step for entry in value]
        twice = sorted({step for step in steps if steps.count(step) > 1})
        if twice:
            raise ValueError(f"step {twice[0]} is listed more than once; give each step one checkpoint")
        return value

    @field_validator("wandb_run_path")
    @classmethod
    def _wandb_run_path(cls, value: str | None) -> str | None:
        if value is not None:
            parts = value.split("/")
            if len(parts) != 3 or not all(part.strip() for part in parts) or value != value.strip():
                raise ValueError(f'{value!r} is not a W&B run path: write "entity/project/run_id" (or null for no W&B)')
        return value

    @field_validator("kl_penalty_tau", mode="before")
    @classmethod
    def _kl_penalty_off(cls, value: Any) -> Any:
        return 0.0 if value is None else value

    @field_validator("resume_from_checkpoint")
    @classmethod
    def _resume_step(cls, value: bool | int) -> bool | int:
        if not isinstance(value, bool) and value < 0:
            raise ValueError("resume_from_checkpoint is true, false or a step number >= 0")
        return value

    @model_validator(mode="after")
    def _cross_field_rules(self, info: ValidationInfo) -> TelescopeConfig:
        # A default that contradicts a field the user set yields to it; a value the
        # user set explicitly is never overridden (the rule below then reports it).
        if (
            self.free_lane_after_generation
            and not self.enable_individual_sample_lanes
            and "free_lane_after_generation" not in self.model_fields_set
        ):
            # still constructing: the frozen model's fields are set once, here (not a later mutation)
            object.__setattr__(self, "free_lane_after_generation", False)
        if info.context and info.context.get("defer_cross_field_rules"):
            return self  # the loader reports them together with the registry rules
        problems = cross_field_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self
