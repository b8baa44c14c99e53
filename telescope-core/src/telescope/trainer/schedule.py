"""The learning-rate schedule: linear warmup, then constant, linear or cosine decay.

The schedule advances once per *trainer step* (one rollout batch, whatever
``number_of_minibatches``), over ``number_of_steps`` steps, so ``warmup_steps`` and
``number_of_steps`` count the same thing. ``none`` ignores ``warmup_steps``.
The scheduler's state (its step) is saved in checkpoints and restored on resume.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

SchedulerName = Literal["none", "constant", "linear", "cosine"]


def lr_factor(step: int, name: SchedulerName, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of ``learning_rate`` at trainer step ``step`` (0-based)."""
    if name == "none":
        return 1.0
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if name == "constant":
        return 1.0
    decay_steps = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / decay_steps, 1.0)
    shape = 1.0 - progress if name == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_lr_ratio + (1.0 - min_lr_ratio) * shape


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    name: SchedulerName,
    warmup_steps: int,
    total_steps: int,
    min_lr_ratio: float,
) -> torch.optim.lr_scheduler.LambdaLR:
    def factor(step: int) -> float:
        return lr_factor(step, name, warmup_steps, total_steps, min_lr_ratio)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
