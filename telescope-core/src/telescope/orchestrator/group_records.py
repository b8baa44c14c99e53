"""The scheduler's records of a group's way through it, and the per-request sampling seed.

:class:`ScheduledGroup` is a group in flight (its server, target step, policy version
at dispatch, task); :class:`ReadyGroup` an accepted group waiting for a batch;
:class:`SchedulerStats` what happened since the last batch (discards, errors,
dispatches); :class:`NoLearningSignal` the error that stops a run whose groups keep
having equal rewards. :func:`request_seed` derives each request's sampling seed from
the run seed, so the same seed gives the same requests (the evals use it too).
The scheduler itself is :mod:`telescope.orchestrator.scheduler`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field

from telescope.api import events
from telescope.api.records import Group, Rollout
from telescope.orchestrator.prompts import PromptItem
from telescope.recording.rollout_metrics import DiscardLog


class NoLearningSignal(RuntimeError):
    """Every group for too long had all rewards equal: no batch can be formed (see the module docstring)."""


@dataclass
class ScheduledGroup:
    """A group on its way: where it runs, what step it is for, what it produced."""

    item: PromptItem
    target_step: int
    dispatch_version: int
    server: int
    task: asyncio.Task[None] | None = None
    group_id: int = -1
    dispatched_at: float = field(default_factory=time.time)
    redispatches: int = 0

    def emit(self, kind: str, **fields: object) -> None:
        """A timeline event about this group, timed from its dispatch."""
        events.emit(
            f"orchestrator.{kind}",
            start=self.dispatched_at,
            duration_s=time.time() - self.dispatched_at,
            component="orchestrator",
            group_id=self.group_id,
            sample_id=self.item.sample.sample_id,
            server=self.server,
            target_step=self.target_step,
            dispatch_version=self.dispatch_version,
            **fields,
        )


@dataclass
class ReadyGroup:
    """A finished, accepted group waiting for its step's batch."""

    group: Group
    slot: int
    target_step: int
    dispatch_version: int
    item: PromptItem
    scheduled: ScheduledGroup | None = None


@dataclass
class SchedulerStats:
    """What happened since the last batch: discards by reason, errors, dispatches.

    Discarded and canceled rollouts go to a :class:`DiscardLog`, which also makes
    their metrics. The driver takes the whole record after each batch
    (:meth:`RolloutScheduler.take_stats`) and the scheduler starts a new one.
    """

    discards: DiscardLog = field(default_factory=DiscardLog)
    errored_rollouts: list[Rollout] = field(default_factory=list)
    groups_dispatched: int = 0
    failed_groups: int = 0
    #: groups sent again to another server because theirs failed
    groups_redispatched: int = 0
    #: groups dropped as stale or zero-advantage (cancellations are counted per rollout)
    discarded_groups: int = 0

    @property
    def canceled_rollouts(self) -> int:
        return self.discards.canceled


def request_seed(seed: int, draw: int, index: int, turn: int) -> int:
    """A per-request sampling seed: the same run seed gives the same requests."""
    digest = hashlib.sha256(f"{seed}/{draw}/{index}/{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


__all__ = ["NoLearningSignal", "ReadyGroup", "ScheduledGroup", "SchedulerStats", "request_seed"]
