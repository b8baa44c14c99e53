"""The trainer-backend interface: a training batch in, a gradient step and its metrics out.

A backend owns the model, the optimizer, the LR schedule and the distributed
setup (FSDP, Megatron, ...). It is algorithm-blind: it receives the
:class:`~telescope.api.algorithm.Algorithm` and asks it for per-token losses.

``train_step`` returns step metrics named with the section/group/metric
convention (``entropy``, ``grad_norm``, ``timing_forward_total``, ...). A custom
backend adds keys by overriding it::

    def train_step(self, batch):
        metrics = super().train_step(batch)
        metrics["custom/my_metric"] = 1.0
        return metrics

Contract details every backend follows (``telescope.testing.trainer`` checks them):

- the constructor receives the run's :class:`~telescope.api.context.TrainerContext`
  (model, optimizer, schedule, packing), the algorithm, and the backend's own
  settings (the fields it declared at registration), never the whole config;
- one instance per rank; ``setup(rank, world_size, device=None)`` joins the
  process group (``MASTER_ADDR``/``MASTER_PORT`` for more than one rank);
- every rank receives the *same* full :class:`TrainingBatch`; the backend shards it;
- ``train_step``, ``named_weights``, ``save_checkpoint`` and ``load_checkpoint`` are
  collective: call them on every rank (``named_weights`` yields on every rank);
- losses are normalised by global counts (all micro-batches, all ranks) and the
  metrics are reduced over ranks, not taken from rank 0;
- ``step`` counts completed trainer steps and is restored by ``load_checkpoint``;
- ``drain_events`` returns the timeline records of the steps since its last call
  (phases per micro-batch; with ``context.track_gpu_events``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from telescope.api.algorithm import Algorithm
    from telescope.api.context import TrainerContext
    from telescope.api.records import SupervisedExample, TrainingBatch
    from telescope.api.settings import PluginSettings


class TrainerBackend(ABC):
    """Base class of trainer backends (one instance per trainer rank)."""

    name: ClassVar[str] = ""

    def __init__(self, context: TrainerContext, algorithm: Algorithm, settings: PluginSettings | None = None) -> None:
        self.context = context
        self.algorithm = algorithm
        self.settings = settings
        self.step = 0

    @abstractmethod
    def setup(self, rank: int = 0, world_size: int = 1, device: str | None = None) -> None:
        """Build the model, optimizer and scheduler; join the process group (device None = best available)."""

    @abstractmethod
    def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        """One rollout batch: ``number_of_minibatches`` optimizer steps; returns metrics."""

    @abstractmethod
    def supervised_step(self, examples: list[SupervisedExample], learning_rate: float) -> dict[str, float]:
        """One supervised step: cross-entropy on the completion tokens of ``examples`` (the warm start).

        Collective like ``train_step``; every rank receives the same examples. It uses
        an optimizer of its own at ``learning_rate`` (the RL optimizer's state and LR
        schedule are untouched) and returns at least ``loss`` (mean token
        cross-entropy) and ``grad_norm``.
        """

    @abstractmethod
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) weights in Hugging Face naming, for the weight transport."""

    @abstractmethod
    def save_checkpoint(self, path: Path, *, training_state: bool = True) -> None:
        """Write a checkpoint atomically (weights, and optimizer/scheduler/RNG state)."""

    @abstractmethod
    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Restore a checkpoint; returns what it recorded (step, ...)."""

    def drain_events(self) -> list[dict[str, Any]]:
        """Timeline records since the last call, then forgotten: ``{"kind": "trainer.<phase>", "start",
        "duration_s", ...}`` dicts (``microbatch``, ``minibatch``); the worker adds ``rank`` and ``step``.

        Backends that record none keep this default (no records).
        """
        return []

    def close(self) -> None:
        """Release the process group and memory."""
