"""What the orchestrator needs from the trainer: the training handle.

The orchestrator (:mod:`telescope.orchestrator.orchestrator`) is written against two
handles: :class:`~telescope.inference.generation.GenerationService` (generate a
completion on inference server ``i``; :mod:`telescope.inference.generation`) and
:class:`TrainingService` here (a training step, a supervised step, push new weights
to every server, save and load checkpoints). :mod:`telescope.runtime.ray_services`
implements both with Ray actors (trainer ranks, inference servers); ``telescope
eval`` implements only generation (:mod:`telescope.runtime.standalone_eval`); tests
implement them with in-process fakes, so the orchestration logic is tested without
Ray or a model.

Faults. A training service raises :class:`TrainerFailure` when a rank died. It is an
abstract base class: an implementation subclasses it and writes the abstract
methods; the optional capabilities are methods with defaults that it overrides when
it has them:

- ``can_restart_trainer`` and ``restart_trainer()`` (async): replace every trainer
  rank by a new one (raising :class:`TrainerFailure` when it cannot); the
  orchestrator then loads the last checkpoint (default: cannot);
- ``fault_metrics() -> dict[str, float]``: counters for the step metrics (default: none);
- ``probe() -> list[dict]`` (async): the watchdog's findings on each trainer rank (see
  :mod:`telescope.orchestrator.watchdog`; default: none).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from telescope.api.records import SupervisedExample, TrainingBatch

__all__ = ["TrainerFailure", "TrainingService"]


class TrainerFailure(RuntimeError):
    """A trainer rank died (or its actor is gone): the trainer group must restart to go on."""

    def __init__(self, what: str, cause: BaseException | None = None) -> None:
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        super().__init__(f"{what}{detail}")
        self.what = what


class TrainingService(ABC):
    """The trainer ranks behind a run, and the weight path from them to the servers."""

    #: Whether :meth:`restart_trainer` can replace the ranks (else a rank's death ends the run).
    can_restart_trainer: ClassVar[bool] = False

    @abstractmethod
    async def wait_ready(self) -> None:
        """Return once every rank is set up and the weight path connected; raise if that failed.

        The orchestrator calls it before any other method; the servers may be generating
        already (see the orchestrator's start-up).
        """

    @abstractmethod
    async def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        """One trainer step on every rank; returns the rank-averaged step metrics."""

    @abstractmethod
    async def supervised_step(self, examples: list[SupervisedExample], learning_rate: float) -> dict[str, float]:
        """One supervised (cross-entropy) step on demonstrations, on every rank (the warm start)."""

    @abstractmethod
    async def push_weights(self, version: int, *, held_servers: Sequence[int] = ()) -> dict[str, float]:
        """Send the trainer's weights to every server as ``version``; returns timings.

        Servers in ``held_servers`` take part in the transfer but keep the weights they
        have (an eval server while its eval runs: one set of weights per eval).
        """

    @abstractmethod
    async def save_checkpoint(self, step: int) -> None:
        """Every trainer rank saves checkpoint ``step`` (atomic; ``latest``; retention)."""

    @abstractmethod
    async def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Every trainer rank restores the checkpoint folder ``path``."""

    async def restart_trainer(self) -> None:
        """Replace every trainer rank by a new one (only where :attr:`can_restart_trainer`)."""
        raise TrainerFailure(f"{type(self).__name__} cannot restart its trainer ranks")

    def fault_metrics(self) -> dict[str, float]:
        """Fault counters for the step's metrics."""
        return {}

    async def probe(self) -> list[dict[str, Any]]:
        """The watchdog's findings on each trainer rank (:mod:`telescope.orchestrator.watchdog`)."""
        return []
