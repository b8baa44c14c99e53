"""What is learned and how: the trainer, the algorithm, the output filters.

Each class is one section of the reference documentation (:mod:`telescope.schema.sections`);
:class:`~telescope.schema.config.TelescopeConfig` composes them.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from telescope.schema.sections import SectionFields


class TrainerFields(SectionFields):
    """The fields of the 'trainer' section."""

    section: ClassVar[str] = "trainer"

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


class AlgorithmFields(SectionFields):
    """The fields of the 'algorithm' section."""

    section: ClassVar[str] = "algorithm"

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


class OverlongAndOutputFiltersFields(SectionFields):
    """The fields of the 'overlong and output filters' section."""

    section: ClassVar[str] = "overlong and output filters"

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
