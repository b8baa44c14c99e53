"""The sections of the core's fields, in the order of the reference documentation.

The defaults file (``telescope config defaults``) and ``telescope config show`` group
the fields by these sections; a plugin's fields go under its settings model's
``section`` (:mod:`telescope.config.composition`). Limit: each field is named here and
in :class:`~telescope.config.schema.TelescopeConfig`; a field missing here is shown
under "other".
"""

from __future__ import annotations

from telescope.config.schema import TelescopeConfig

#: Section of every core field, in the order of the reference documentation.
SECTIONS: dict[str, str] = {}


def _section(name: str, fields: list[str]) -> None:
    for field_name in fields:
        SECTIONS[field_name] = name


_section("general", ["debug", "seed", "run_dir"])
_section(
    "model",
    [
        "model",
        "model_dtype",
        "warm_start_steps",
        "warm_start_learning_rate",
        "warm_start_batch_size",
    ],
)
_section("environments", ["environments"])
_section("workers", ["inference_num_workers", "inference_tensor_parallel_size", "trainer_num_workers"])
_section(
    "orchestrator",
    [
        "max_concurrent_prompts_per_server",
        "prompts_batch_size_for_trainer",
        "number_of_steps",
        "max_async_rollout",
        "discard_group_zero_advantage",
        "enable_prompt_prefetch",
        "prompt_prefetch_buffer_size",
        "enable_individual_sample_lanes",
        "free_lane_after_generation",
        "max_off_policy_steps",
        "stale_token_policy",
        "continue_requests_across_updates",
        "batch_assembly",
        "eager_prepare_resources",
    ],
)
_section(
    "trainer",
    [
        "learning_rate",
        "weight_decay",
        "grad_clip",
        "lr_scheduler",
        "warmup_steps",
        "min_lr_ratio",
        "train_backend",
    ],
)
_section(
    "algorithm",
    [
        "algorithm",
        "number_of_minibatches",
        "advantage_norm",
        "use_ppo_clip",
        "ppo_clip_ref_logprobs",
        "clip_low",
        "clip_high",
        "clip_ratio_c",
        "use_tis",
        "tis_cap",
        "tis_logprob_clamp",
        "tis_mode",
        "tis_floor",
        "kl_penalty_tau",
        "kl_estimator",
        "entropy_coef",
        "entropy_chunk_size",
        "seq_is_masking",
        "seq_is_mask_low",
        "seq_is_mask_high",
    ],
)
_section(
    "overlong and output filters",
    [
        "filter_overlong",
        "overlong_penalty_factor",
        "overlong_buffer_tokens",
        "filter_gibberish",
        "gibberish_token_threshold",
        "gibberish_logprob_offset",
        "filter_repetition",
        "repetition_compression_threshold",
    ],
)
_section("rollout / sampling", ["group_size", "temperature", "top_p", "max_tokens", "interleaved_rollouts"])
_section(
    "compaction",
    ["compaction", "compaction_threshold", "compaction_instruction", "compaction_keep_turns"],
)
_section("sequence packing", ["seq_len", "pad_to_multiple_of"])
_section(
    "inference server",
    [
        "inference_backend",
        "inference_host",
        "inference_base_port",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "vllm_scheduling_policy",
        "enable_thinking",
        "chat_template",
    ],
)
_section("sandboxes", ["sandbox_provider"])
_section(
    "checkpointing",
    [
        "checkpoint_every",
        "checkpoint_save_training_state",
        "resume_from_checkpoint",
        "checkpoint_dir",
        "checkpoint_keep_last",
        "checkpoint_keep_every",
    ],
)
_section(
    "fault tolerance",
    [
        "inference_request_timeout_s",
        "reward_timeout_s",
        "environment_step_timeout_s",
        "max_consecutive_zero_advantage_batches",
        "max_consecutive_errored_batches",
        "watchdog_timeout_s",
        "inference_health_check_interval_s",
        "inference_max_restarts",
        "trainer_max_restarts",
    ],
)
_section(
    "evals",
    [
        "eval_before_training",
        "eval_after_training",
        "eval_num_servers",
        "eval_start_end_use_all_servers",
        "evals",
    ],
)
_section(
    "logging",
    [
        n
        for n in TelescopeConfig.model_fields
        if n.startswith("wandb_")
        or n
        in {
            "use_wandb",
            "system_metrics_collection_interval_seconds",
            "torch_memory_sample_interval_seconds",
            "event_tail_window_seconds",
            "event_block_duration_seconds",
            "event_upload_interval_seconds",
            "metrics_logger_interval_seconds",
            "ray_torch_memory_drain_interval_seconds",
            "rollout_block_size",
            "track_gpu_events",
        }
    ],
)
_section(
    "standalone eval",
    [
        "checkpoints",
        "hf_weights",
        "max_concurrent_samples_per_server",
        "wandb_run_path",
    ],
)
_section("ray cluster", [n for n in TelescopeConfig.model_fields if n.startswith("ray_") and n not in SECTIONS])
_section(
    "weight broadcasting",
    ["weight_transport"] + [n for n in TelescopeConfig.model_fields if n.startswith("weight_broadcast_")],
)
