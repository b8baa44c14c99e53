"""The trainer-backend interface: a training batch in, a gradient step and its metrics out.

A backend owns the model, the optimizer, the LR schedule and the distributed
setup (FSDP, Megatron, ...). It is algorithm-blind: it receives the
:class:`~telescope.api.algorithm.Algorithm` and asks it for per-token losses.

``train_step`` returns step metrics named with the section/group/metric
convention (``entropy``, ``grad_norm``, ``timing/forward/total``, ...). A custom
backend adds keys by overriding it::

    def train_step(self, batch):
        metrics = super().train_step(batch)
        metrics["custom/my_metric"] = 1.0
        return metrics

The conformance kit in ``telescope.testing`` checks any backend against this contract.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from telescope.api.algorithm import Algorithm
    from telescope.api.records import TrainingBatch
    from telescope.config.schema import TelescopeConfig


class TrainerBackend(ABC):
    """Base class of trainer backends (one instance per trainer rank)."""

    name: ClassVar[str] = ""

    def __init__(self, config: TelescopeConfig, algorithm: Algorithm) -> None:
        self.config = config
        self.algorithm = algorithm

    @abstractmethod
    def setup(self, rank: int = 0, world_size: int = 1) -> None:
        """Build the model, optimizer and scheduler; join the process group."""

    @abstractmethod
    def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        """One rollout batch: ``number_of_minibatches`` optimizer steps; returns metrics."""

    @abstractmethod
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) weights in Hugging Face naming, for the weight transport."""

    @abstractmethod
    def save_checkpoint(self, path: Path, *, training_state: bool = True) -> None:
        """Write a checkpoint atomically (weights, and optimizer/scheduler/RNG state)."""

    @abstractmethod
    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Restore a checkpoint; returns what it recorded (step, ...)."""

    def close(self) -> None:
        """Release the process group and memory."""
