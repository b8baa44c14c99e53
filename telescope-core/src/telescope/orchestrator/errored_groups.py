"""Stopping a run whose rollouts all error: no batch can ever be formed from them.

A rollout whose environment code raised or timed out (``compute_reward``,
``env_response``, ``is_done``, a request) is errored: it is dropped from its group,
and a group left with fewer than two rollouts is discarded (``too_few_samples``). A
reward that raises now and then only costs samples; one that always raises leaves
every group empty, so no batch forms, while groups keep finishing (the watchdog sees
progress and says nothing). :class:`ErroredGroupStreak` counts the groups in a row
whose every rollout errored; at ``max_consecutive_errored_batches`` batches' worth
(N x ``prompts_batch_size_for_trainer``) it returns :class:`AllRolloutsErrored`, which
the scheduler raises from ``next_batch`` to fail the run. Its message carries the
error as the last rollout recorded it: the exception's type and message, the call,
sample and environment, and where the exception was raised (``file:line in
function``, :func:`~telescope.orchestrator.rollouts.raised_at`).

A group with one rollout that did not error ends the streak. Limits: the original
exception object is not kept (rollouts record their error as text), so the run fails
with this error, not the environment's exception class; only the last group's first
error is quoted (its other rollouts may have failed differently).
"""

from __future__ import annotations

from collections.abc import Sequence

from telescope.api.records import Rollout


class AllRolloutsErrored(RuntimeError):
    """Every rollout of too many groups in a row errored: no batch can be formed (see the module docstring)."""


class ErroredGroupStreak:
    """Counts the groups in a row whose every rollout errored; :meth:`observe` says when to stop."""

    def __init__(self, max_batches: int, batch_size: int) -> None:
        self.max_batches = max_batches
        self.batch_size = batch_size
        self.limit = max_batches * batch_size  # 0: never stop
        self.count = 0

    def observe(self, environment: str, rollouts: Sequence[Rollout]) -> AllRolloutsErrored | None:
        """Record a finished group of ``environment``; the error to stop the run with, once the limit is reached."""
        errors = [r.error for r in rollouts if r.error]
        if not rollouts or len(errors) < len(rollouts):
            self.count = 0
            return None
        self.count += 1
        if not self.limit or self.count < self.limit:
            return None
        return AllRolloutsErrored(self._message(environment, errors[0]))

    def _message(self, environment: str, error: str) -> str:
        return (
            f"no batch can be formed: every rollout of the last {self.count} groups "
            f"({self.max_batches} x prompts_batch_size_for_trainer {self.batch_size}) errored. The last error, "
            f"environment {environment!r}: {error}. Fix the environment (its reward function or environment "
            "steps); to wait longer, raise max_consecutive_errored_batches (0 = wait forever)"
        )
