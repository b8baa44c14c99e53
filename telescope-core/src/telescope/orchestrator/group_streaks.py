"""Stopping a run that can never form a batch: streaks of groups that all had to be dropped.

Two streaks end a run, each counted in groups and limited to N batches' worth
(N x ``prompts_batch_size_for_trainer``; N = 0 never stops):

- :class:`ZeroAdvantageStreak` (``max_consecutive_zero_advantage_batches``): groups in
  a row discarded because every sample got the same reward. It raises
  :class:`~telescope.orchestrator.group_records.NoLearningSignal`, quoting the rewards
  seen. A group that is kept ends it; a group dropped for another reason leaves it as it is.
- :class:`ErroredGroupStreak` (``max_consecutive_errored_batches``): groups in a row
  whose every rollout errored (its environment code raised or timed out:
  ``compute_reward``, ``env_response``, ``is_done``, a request). A reward that raises
  now and then only costs samples; one that always raises leaves every group empty, so
  no batch forms while groups keep finishing (the watchdog sees progress and says
  nothing). It raises :class:`AllRolloutsErrored` with the error as the last rollout
  recorded it: the exception's type and message, the call, sample and environment, and
  where it was raised (``file:line in function``,
  :func:`~telescope.orchestrator.rollouts.raised_at`). A group with one rollout that
  did not error ends it.

The scheduler keeps the error and raises it from ``next_batch`` to fail the run.
Limits: the original exception object is not kept (rollouts record their error as
text), so the run fails with :class:`AllRolloutsErrored`, not the environment's
exception class; only the last group's first error is quoted (its other rollouts may
have failed differently).
"""

from __future__ import annotations

from collections.abc import Sequence

from telescope.api.records import Group, Rollout
from telescope.orchestrator.group_records import NoLearningSignal


class AllRolloutsErrored(RuntimeError):
    """Every rollout of too many groups in a row errored: no batch can be formed (see the module docstring)."""


class GroupStreak:
    """Groups in a row that met a condition, against a limit of ``max_batches`` batches' worth."""

    def __init__(self, max_batches: int, batch_size: int) -> None:
        self.max_batches = max_batches
        self.batch_size = batch_size
        self.limit = max_batches * batch_size  # 0: never stop
        self.count = 0

    def reset(self) -> None:
        self.count = 0

    def extend(self) -> bool:
        """One more group in the streak; whether it reached the limit."""
        self.count += 1
        return bool(self.limit) and self.count >= self.limit


class ErroredGroupStreak(GroupStreak):
    """Counts the groups in a row whose every rollout errored; :meth:`observe` says when to stop."""

    def observe(self, environment: str, rollouts: Sequence[Rollout]) -> AllRolloutsErrored | None:
        """Record a finished group of ``environment``; the error to stop the run with, once the limit is reached."""
        errors = [r.error for r in rollouts if r.error]
        if not rollouts or len(errors) < len(rollouts):
            self.reset()
            return None
        if not self.extend():
            return None
        return AllRolloutsErrored(
            f"no batch can be formed: every rollout of the last {self.count} groups "
            f"({self.max_batches} x prompts_batch_size_for_trainer {self.batch_size}) errored. The last error, "
            f"environment {environment!r}: {errors[0]}. Fix the environment (its reward function or environment "
            "steps); to wait longer, raise max_consecutive_errored_batches (0 = wait forever)"
        )


class ZeroAdvantageStreak(GroupStreak):
    """Counts the groups in a row discarded as zero-advantage; :meth:`discarded` says when to stop."""

    def discarded(self, recent: Sequence[Group]) -> NoLearningSignal | None:
        """One more zero-advantage group; the error to stop the run with (``recent``: the last such groups)."""
        if not self.extend():
            return None
        rewards = sorted({r.reward.total_reward for g in recent for r in g.rollouts if r.reward is not None})
        shown = ", ".join(f"{r:g}" for r in rewards[:5]) + (", ..." if len(rewards) > 5 else "")
        return NoLearningSignal(
            f"no batch can be formed: the last {self.count} groups ({self.max_batches} batches of "
            f"{self.batch_size}) were all discarded as zero-advantage (every sample of a group got the same "
            f"reward{': ' + shown if shown else ''}), so there is no learning signal. The task may be too hard or "
            "too easy for the model, or the reward function may be broken. Raise "
            "max_consecutive_zero_advantage_batches (0 = wait forever), or set "
            "discard_group_zero_advantage: false to train on such groups"
        )
