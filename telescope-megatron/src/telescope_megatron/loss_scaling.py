"""Dynamic loss scaling for float16 compute, by the rules of megatron-core's ``DynamicGradScaler``.

float16's smallest normal number is about 6e-5, so small gradients would flush to
zero in a float16 backward. Each micro-batch's loss is multiplied by :attr:`DynamicLossScale.scale`
before its backward (:meth:`~telescope.trainer.public.PackedTrainerBackend.loss_scale`);
the reduced gradients are divided by it when they become the float32 main gradients
(:meth:`telescope_megatron.precision.MainParameters.main_grads`), before the norm. A
non-finite gradient norm (an inf or nan anywhere: the norm is the same on every rank)
means the scale was too large: the optimizer step is skipped (counted in
``optimizer/skipped_steps``) and :meth:`DynamicLossScale.update` counts it.

The rules (megatron-core's, with its ``OptimizerConfig`` defaults as this class's):
each skipped step lowers a hysteresis counter (``hysteresis``, 2); once it is spent,
each skipped step multiplies the scale by ``backoff_factor`` (0.5), not below
``min_scale`` (1). ``growth_interval`` (1000) good steps in a row multiply it by
``growth_factor`` (2) and restore the hysteresis counter. The scale starts at 2**32 and
so falls quickly to what the model's gradients allow. The upstream config has no
field for these, so they are constants here; the scale is reported as
``optimizer/loss_scale``, and saved with a checkpoint's training state.

Limits: dynamic scaling only (no static ``loss_scale``); bfloat16 is not scaled (it
has float32's range), as in megatron-core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DynamicLossScale:
    """The loss scale and its counters; :meth:`update` after every optimizer step (taken or skipped)."""

    scale: float = 2.0**32
    min_scale: float = 1.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 1000
    hysteresis: int = 2
    good_steps: int = field(default=0, init=False)
    hysteresis_left: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not 0 < self.min_scale <= self.scale:
            raise ValueError(f"loss scaling: need 0 < min_scale ({self.min_scale}) <= scale ({self.scale})")
        if self.growth_factor <= 1:
            raise ValueError(f"loss scaling: growth_factor must be above 1, not {self.growth_factor}")
        if not 0 < self.backoff_factor < 1:
            raise ValueError(f"loss scaling: backoff_factor must be in (0, 1), not {self.backoff_factor}")
        if self.growth_interval < 1 or self.hysteresis < 1:
            raise ValueError(
                f"loss scaling: growth_interval ({self.growth_interval}) and hysteresis ({self.hysteresis}) "
                "must be at least 1"
            )
        self.hysteresis_left = self.hysteresis

    def update(self, found_inf: bool) -> None:
        """Count one optimizer step: skipped (``found_inf``) or taken; lower or raise the scale by the rules."""
        if found_inf:
            self.good_steps = 0
            self.hysteresis_left -= 1
            if self.hysteresis_left <= 0:
                self.scale = max(self.scale * self.backoff_factor, self.min_scale)
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.good_steps = 0
            self.hysteresis_left = self.hysteresis
            self.scale *= self.growth_factor

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "good_steps": self.good_steps, "hysteresis_left": self.hysteresis_left}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])
        self.hysteresis_left = int(state["hysteresis_left"])
