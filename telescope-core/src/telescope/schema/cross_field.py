"""The core's rules between config fields: those that need no plugin, one message per broken rule.

Split by what they protect: :func:`_training_problems` (a training run: an environment,
the algorithm's settings, packing, the orchestrator's lanes) and
:func:`_inference_problems` (the inference servers and the evals, which a standalone
eval starts too). ``telescope eval`` asks only the second (``purpose="eval"``).
Rules that need the plugin registry are in :mod:`telescope.config.rules`; those of
compaction and staleness across weight updates in :mod:`telescope.schema.long_horizon`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from telescope.schema.long_horizon import long_horizon_problems

if TYPE_CHECKING:
    from telescope.schema.fields import ConfigFields

#: What a config is loaded for: a training run (``telescope run``) or a standalone eval (``telescope eval``).
Purpose = Literal["run", "eval"]


def cross_field_problems(c: ConfigFields, *, layer: bool = False, purpose: Purpose = "run") -> list[str]:
    """Rules between fields that need no plugin; one message per broken rule.

    ``layer``: the config is a defaults layer, not a run (``telescope config validate
    --defaults``): what only a run needs (an environment) is not asked for.
    ``purpose``: ``"run"`` checks everything a training run needs; ``"eval"`` (``telescope
    eval``, which starts inference servers and nothing else) only the rules of the
    inference servers and the evals, and :func:`telescope.config.eval_form.eval_problems`
    adds what an eval needs.
    """
    problems = (
        _training_problems(c, layer=layer) + _schedule_problems(c) + long_horizon_problems(c)
        if purpose == "run"
        else []
    )
    return problems + _inference_problems(c) + _seed_problems(c) + _fixed_upstream_problems(c)


def _schedule_problems(c: ConfigFields) -> list[str]:
    """A warmup the run never finishes: the LR would never reach ``learning_rate`` (or never decay)."""
    if c.lr_scheduler in ("linear", "cosine") and c.warmup_steps >= c.number_of_steps:
        return [
            f"warmup_steps ({c.warmup_steps}) must be smaller than number_of_steps ({c.number_of_steps}) with "
            f"lr_scheduler: {c.lr_scheduler}: the decay starts after the warmup, so the learning rate would "
            "never decay; lower warmup_steps or raise number_of_steps"
        ]
    if c.lr_scheduler == "constant" and c.warmup_steps > c.number_of_steps:
        return [
            f"warmup_steps ({c.warmup_steps}) exceeds number_of_steps ({c.number_of_steps}): the learning rate "
            "would still be warming up when the run ends and never reach learning_rate; lower warmup_steps"
        ]
    return []


#: The largest seed every consumer accepts: vLLM seeds numpy (``np.random.seed``, below 2^32) with it.
MAX_SEED = 2**32 - 1


def _seed_problems(c: ConfigFields) -> list[str]:
    """Inference server ``i`` is seeded with ``seed + i``: each must stay in numpy's range."""
    servers = max(c.inference_num_workers // c.inference_tensor_parallel_size, 1)
    if c.seed + servers - 1 > MAX_SEED:
        return [
            f"seed ({c.seed}) + the inference servers ({servers}) - 1 must be at most 2^32 - 1 ({MAX_SEED}): "
            "inference server i is seeded with seed + i, and vLLM seeds numpy, which takes no larger seed; "
            f"use a seed of at most {MAX_SEED - servers + 1}"
        ]
    return []


def _training_problems(c: ConfigFields, *, layer: bool) -> list[str]:
    problems: list[str] = []
    if not c.environments and not layer:
        problems.append("environments: at least one environment is required, e.g. environments: [{name: countdown}]")
    if c.use_tis and c.use_ppo_clip and c.ppo_clip_ref_logprobs == "rollout":
        problems.append(
            "use_tis=true with use_ppo_clip=true and ppo_clip_ref_logprobs='rollout' counts the "
            "importance-sampling correction twice; set ppo_clip_ref_logprobs: batch (or turn one off)"
        )
    if c.clip_ratio_c is not None and c.clip_ratio_c <= 1.0:
        problems.append(
            f"clip_ratio_c ({c.clip_ratio_c}) must be > 1 (dual clip bounds the loss of negative advantages "
            "at -clip_ratio_c * A, above the PPO clip's -(1 - clip_low) * A); null disables it"
        )
    if c.tis_floor >= c.tis_cap:
        problems.append(f"tis_floor ({c.tis_floor}) must be below tis_cap ({c.tis_cap})")
    if not c.use_tis and c.tis_mode == "icepop":
        problems.append("tis_mode='icepop' needs use_tis=true (it chooses how the TIS weight is bounded)")
    if not c.use_tis and c.tis_floor > 0:
        problems.append(f"tis_floor ({c.tis_floor}) bounds the TIS weight and needs use_tis=true")
    if c.overlong_penalty_factor > 0 and c.overlong_buffer_tokens > c.max_tokens:
        problems.append(
            f"overlong_buffer_tokens ({c.overlong_buffer_tokens}) must not exceed max_tokens ({c.max_tokens}) "
            "when overlong_penalty_factor > 0: the penalty ramps over the last overlong_buffer_tokens tokens "
            "before max_tokens"
        )
    if c.free_lane_after_generation and not c.enable_individual_sample_lanes:
        problems.append(
            "free_lane_after_generation=true requires enable_individual_sample_lanes=true; "
            "enable lanes or set free_lane_after_generation: false"
        )
    if c.seq_len < c.max_model_len:
        problems.append(
            f"seq_len ({c.seq_len}) must be at least max_model_len ({c.max_model_len}): a sample "
            "(prompt + completion) can be max_model_len tokens and must fit in one packed sequence"
        )
    if c.seq_len % c.pad_to_multiple_of:
        problems.append(f"seq_len ({c.seq_len}) must be a multiple of pad_to_multiple_of ({c.pad_to_multiple_of})")
    if c.number_of_minibatches > c.prompts_batch_size_for_trainer:
        problems.append(
            f"number_of_minibatches ({c.number_of_minibatches}) cannot exceed "
            f"prompts_batch_size_for_trainer ({c.prompts_batch_size_for_trainer}): each minibatch needs a group"
        )
    if c.evals and c.eval_num_servers >= c.inference_num_workers:
        problems.append(
            f"eval_num_servers ({c.eval_num_servers}) must leave at least one of the "
            f"inference_num_workers ({c.inference_num_workers}) for training; lower eval_num_servers "
            "(0 = evals only before/after training) or add inference workers"
        )
    return problems


def _inference_problems(c: ConfigFields) -> list[str]:
    """The rules of the inference servers and the evals (a training run and ``telescope eval`` alike)."""
    problems: list[str] = []
    if (
        c.max_num_seqs is not None
        and c.max_num_batched_tokens is not None
        and c.max_num_batched_tokens < c.max_num_seqs
    ):
        problems.append(
            f"max_num_batched_tokens ({c.max_num_batched_tokens}) must be at least max_num_seqs ({c.max_num_seqs}): "
            "every running sequence decodes one token per step"
        )
    if c.inference_num_workers % c.inference_tensor_parallel_size:
        problems.append(
            f"inference_num_workers ({c.inference_num_workers}) must be divisible by "
            f"inference_tensor_parallel_size ({c.inference_tensor_parallel_size})"
        )
    if c.max_tokens >= c.max_model_len:
        problems.append(
            f"max_tokens ({c.max_tokens}) must be smaller than max_model_len ({c.max_model_len}): "
            "the prompt needs room in the context"
        )
    for i, entry in enumerate(c.evals):
        max_tokens = entry.max_tokens if entry.max_tokens is not None else c.max_tokens
        if max_tokens >= c.max_model_len:
            problems.append(
                f"evals[{i}] ({entry.name}): max_tokens ({max_tokens}) must be smaller than "
                f"max_model_len ({c.max_model_len})"
            )
    return problems


#: Upstream fields kept so that its configs validate, with the only value the code honours and why.
FIXED_UPSTREAM: dict[str, tuple[object, str]] = {
    "weight_broadcast_free_grad_buffers": (
        True,
        "both trainer backends free the gradients (set them to None) after every optimizer step, "
        "so none is held while the weights are broadcast; keeping them is not built",
    ),
    "ray_propagate_run_dir": (
        True,
        "every worker is given the run directory (its checkpoints and logs are written there); "
        "withholding it is not built",
    ),
}


def _fixed_upstream_problems(c: ConfigFields) -> list[str]:
    """An upstream field set to a value the run cannot honour (see :data:`FIXED_UPSTREAM`)."""
    return [
        f"{name}={getattr(c, name)!r} is not supported: {why}; set it to {value!r} (or leave it out)"
        for name, (value, why) in FIXED_UPSTREAM.items()
        if getattr(c, name) != value
    ]
