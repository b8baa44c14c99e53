"""The list-valued config entries: environments to train on, evals to run, checkpoints to evaluate."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: The most entries of each list of environments or evals a config may hold. Each entry
#: builds an environment (and loads its dataset) at run time, so a run mixes a handful;
#: the bound lets the YAML reader refuse a runaway list before building it.
MAX_ENTRIES = 1000

#: The lists bounded by :data:`MAX_ENTRIES`, by their path in a config file.
BOUNDED_LISTS: dict[tuple[str | int, ...], int] = {("environments",): MAX_ENTRIES, ("evals",): MAX_ENTRIES}


class EnvironmentEntry(BaseModel):
    """One training environment (``environments:`` list item)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Environment name (must match a registered environment)")
    weight: float = Field(default=1.0, gt=0, description="Sampling weight for multi-environment training (must be > 0)")
    reward_min: float | None = Field(
        default=None, description="Expected minimum reward (UI charts, per-environment normalisation)"
    )
    reward_max: float | None = Field(
        default=None, description="Expected maximum reward (UI charts, per-environment normalisation)"
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Environment-specific keyword arguments")

    @model_validator(mode="after")
    def _check_reward_range(self) -> EnvironmentEntry:
        if self.reward_min is not None and self.reward_max is not None and self.reward_max <= self.reward_min:
            raise ValueError(
                f"environment {self.name!r}: reward_max ({self.reward_max}) must be greater than "
                f"reward_min ({self.reward_min})"
            )
        return self


class EvalEntry(BaseModel):
    """One eval (``evals:`` list item)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Eval name (an environment name or a dedicated eval like math500)")
    eval_every: int = Field(default=10, ge=1, description="Run this eval every N training steps")
    num_samples: int = Field(default=-1, ge=-1, description="Number of samples to evaluate. -1 = full dataset")
    separate_eval_samples: bool = Field(
        default=False,
        description="Reserve this eval's samples (the first num_samples) exclusively for eval: "
        "they never reach training",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Environment-specific keyword arguments")
    pass_k: dict[str, Any] = Field(
        default_factory=dict,
        description="pass@k / pass^k: {k: [1, 4], n: 8} samples n completions per problem "
        "(n >= max k) and reports the unbiased estimators",
    )
    temperature: float | None = Field(default=None, gt=0, description="Override sampling temperature (null = inherit)")
    top_p: float | None = Field(default=None, gt=0, le=1, description="Override nucleus sampling (null = inherit)")
    max_tokens: int | None = Field(default=None, ge=1, description="Override max tokens (null = inherit)")

    @field_validator("num_samples")
    @classmethod
    def _no_zero_samples(cls, value: int) -> int:
        if value == 0:
            raise ValueError("num_samples must be -1 (the full dataset) or at least 1")
        return value

    @field_validator("pass_k")
    @classmethod
    def _check_pass_k(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not value:
            return value
        unknown = set(value) - {"k", "n"}
        if unknown:
            raise ValueError(f"pass_k takes the keys 'k' and 'n', not {sorted(unknown)}")
        ks = value.get("k", [1])
        ks = [ks] if isinstance(ks, int) else ks
        if not isinstance(ks, list) or not ks or not all(isinstance(k, int) and k >= 1 for k in ks):
            raise ValueError("pass_k.k must be a positive integer or a list of them")
        n = value.get("n", max(ks))
        if not isinstance(n, int) or n < max(ks):
            raise ValueError(f"pass_k.n ({n}) must be an integer >= the largest k ({max(ks)})")
        return {"k": sorted(set(ks)), "n": n}


class CheckpointEntry(BaseModel):
    """One checkpoint for ``telescope eval`` (``checkpoints:`` list item): a folder and its training step.

    The folder is a native checkpoint or a Hugging Face model folder as ``hf_weights``
    says; a relative path is taken from the current directory (as ``checkpoint_dir`` is).
    Whether it exists is checked when the eval starts, not at load time, so a config
    validates on a machine without the checkpoints.
    """

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, description="Checkpoint folder")
    step: int = Field(ge=0, description="Training step of this checkpoint (its results are keyed by it)")
