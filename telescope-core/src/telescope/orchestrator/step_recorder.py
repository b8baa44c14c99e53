"""One step's record: every metric of the step, sent everywhere it goes.

Per step, :class:`StepRecorder` merges the trainer's metrics (rank-averaged by the
backend), the rollout metrics of the trained groups (reward, advantage, sample
metrics, Gini coefficients, token lengths, stop reasons), the discarded and
canceled counts by reason, timeouts by kind (``timeouts/{reward,environment_step,inference_request}/count``),
groups re-dispatched because their server failed (``infra/groups_redispatched``), the trained episodes'
policy versions (``policy/versions_per_episode``, ``policy/tokens_per_version``, ``policy/stale_tokens_masked``:
:mod:`telescope.orchestrator.staleness`) and compactions (``compaction/count``, ``compaction/failed``),
timings and run totals (with the services' fault counters), then writes them to the run
store (``metrics.jsonl``; every trained rollout to ``rollouts/``, and every rollout dropped
this step with its ``discard_reason``) and to
each enabled logger (the run store is one :class:`Sink` beside the loggers), to the
``telescope_step_end`` hook, and to the progress bar.

A logger or hook that raises is reported once and dropped; it never stops a run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from telescope.api.logger import Logger
from telescope.api.records import TrainingBatch
from telescope.orchestrator.batching import normalized_reward_metrics
from telescope.orchestrator.deadlines import timeout_metrics
from telescope.orchestrator.group_records import ReadyGroup, SchedulerStats
from telescope.orchestrator.staleness import policy_version_metrics
from telescope.recording.progress import StepProgress
from telescope.recording.rollout_metrics import rollout_step_metrics
from telescope.recording.run_store import RunStore, discarded_records, group_records

if TYPE_CHECKING:
    from telescope.plugins.facade import Plugins


class Sink(Protocol):
    """Where a step's record goes: the run store and every logger alike."""

    def log_step(self, step: int, metrics: dict[str, Any]) -> None: ...

    def log_rollouts(self, step: int, rollouts: list[dict[str, Any]]) -> None: ...

    def log_eval(self, name: str, step: int, metrics: dict[str, Any], **extra: Any) -> None: ...


class Counters(Protocol):
    samples_trained: int
    tokens_trained: int
    groups_discarded: int
    rollouts_canceled: int
    rollouts_errored: int


@dataclass
class StepOutcome:
    """What one training step produced, as the recorder needs it."""

    step: int
    ready: Sequence[ReadyGroup]
    batch: TrainingBatch
    trainer_metrics: dict[str, float]
    timing: dict[str, float]
    stats: SchedulerStats
    counters: Counters
    policy_version: int


class StepRecorder:
    """Assembles and distributes each step's metrics."""

    def __init__(
        self,
        store: RunStore,
        *,
        reward_ranges: dict[str, tuple[float | None, float | None]],
        loggers: Sequence[Logger] = (),
        plugins: Plugins | None = None,
        progress: StepProgress | None = None,
    ) -> None:
        self.store = store
        self.reward_ranges = reward_ranges
        self.loggers = list(loggers)
        self.plugins = plugins
        self.progress = progress
        self.history: list[dict[str, float]] = []

    def step_metrics(self, outcome: StepOutcome) -> dict[str, float]:
        stats, counters, policy_version = outcome.stats, outcome.counters, outcome.policy_version
        groups = [g.group for g in outcome.ready]
        rollouts = [r for g in groups for r in g.rollouts]
        staleness = [policy_version - r.oldest_policy_version for r in rollouts]
        metrics: dict[str, float] = dict(outcome.trainer_metrics)
        advantages = [s.advantage for s in outcome.batch.samples]
        metrics.update(rollout_step_metrics(groups, advantages))
        metrics.update(normalized_reward_metrics(groups, self.reward_ranges))
        filtered = [r for r in rollouts if r.filtered]
        stats.discards.add_filtered(filtered)
        stats.discards.add_trained(len(rollouts) - len(filtered))
        metrics.update(stats.discards.metrics())
        metrics.update(outcome.timing)
        metrics.update(
            {
                "errors/reward_or_environment/count": float(len(stats.errored_rollouts)),
                "errors/failed_groups/count": float(stats.failed_groups),
                **timeout_metrics(r.error for r in stats.errored_rollouts),
                "infra/groups_redispatched": float(stats.groups_redispatched),
                "policy/version": float(policy_version),
                "policy/staleness/mean": sum(staleness) / max(len(staleness), 1),
                "policy/staleness/max": float(max(staleness, default=0)),
                **policy_version_metrics(rollouts),
                "policy/stale_tokens_masked": float(outcome.batch.metadata.get("stale_tokens_masked", 0)),
                "compaction/count": float(sum(r.compactions for r in rollouts)),
                "compaction/failed": float(sum(len(r.compaction_failures) for r in rollouts)),
                "progress/samples_trained": float(counters.samples_trained),
                "progress/tokens_trained": float(counters.tokens_trained),
                "progress/groups_dispatched": float(stats.groups_dispatched),
                "progress/rollouts_canceled_total": float(counters.rollouts_canceled),
                "progress/groups_discarded_total": float(counters.groups_discarded),
                "progress/rollouts_errored_total": float(counters.rollouts_errored),
            }
        )
        return metrics

    def record_step(self, outcome: StepOutcome) -> dict[str, float]:
        step, timing = outcome.step, outcome.timing
        metrics = self.step_metrics(outcome)
        advantages = {(s.group_index, s.rollout_index): s.advantage for s in outcome.batch.samples}
        # attachments (screenshots) become files first: every sink sees their paths, never their bytes
        records = self.store.store_attachments(group_records(step, [g.group for g in outcome.ready], advantages))

        def write(sink: Sink) -> None:
            sink.log_step(step, metrics)
            sink.log_rollouts(step, records)

        self._to_sinks(write)
        # the dropped rollouts go to the run store only (the dashboard's Discarded page); loggers get the trained ones
        self.store.log_rollouts(step, discarded_records(step, outcome.stats.discards.dropped))
        self.store.set_status("running", step=step + 1)
        if self.plugins is not None:
            self.plugins.step_end(step, metrics)
        if self.progress is not None:
            self.progress.update(
                step + 1,
                num_samples=len(records),
                num_tokens=int(sum(r["total_tokens"] for r in records)),
                reward_mean=metrics.get("reward/mean"),
                step_time_s=timing.get("timing_step_total"),
            )
        self.history.append(metrics)
        return metrics

    def note(self, message: str) -> None:
        """A status line for the user (the progress bar's, else stderr)."""
        if self.progress is not None:
            self.progress.write(message)
        else:
            print(message, file=sys.stderr)

    def log_eval(self, name: str, step: int, metrics: dict[str, Any], **extra: Any) -> None:
        self._to_sinks(lambda sink: sink.log_eval(name, step, metrics, **extra))
        if self.progress is not None:
            summary = ", ".join(f"{k.split('/')[-1]}={v:.3f}" for k, v in metrics.items() if isinstance(v, float))
            self.progress.write(f"eval {name} ({extra.get('phase', '')}, step {step}): {summary}")

    def _to_sinks(self, write: Callable[[Sink], None]) -> None:
        """The run store first (the record of truth: its failure is the run's), then every logger (contained)."""
        write(self.store)
        for logger in list(self.loggers):
            try:
                write(logger)
            except Exception as exc:  # a logger never stops a run
                self._drop_logger(logger, exc)

    def _drop_logger(self, logger: Logger, exc: Exception) -> None:
        print(f"warning: logger {logger.name or type(logger).__name__} failed and is disabled: {exc}", file=sys.stderr)
        self.loggers.remove(logger)
