"""The local run store: one directory per run, written by the run, readable while it runs.

Layout of a run directory (``runs/<wandb_run_name>/`` unless ``run_dir`` is set)::

    config.yaml     the resolved config, as text (with provenance comments)
    config.json     the same config as a JSON object
    metrics.jsonl   one object per step: {"step": int, "time": float, <metric>: value, ...}
    evals.jsonl     one object per eval run: {"name", "step", "time", "metrics": {...}, ...}
    events/         timeline events from :mod:`telescope.api.events`, in blocks of
                    ``event_block_duration_seconds``: block-<N>.parquet (sealed) and
                    tail-<N>.jsonl + tail-<N>.idx (the open block), _meta.json
    rollouts/       one record per rollout (see :func:`rollout_record`), in blocks of
                    ``rollout_block_size`` rollouts, same files; the rollouts the
                    orchestrator dropped have a ``discard_reason`` (:func:`discarded_records`)
    status.json     {"status", "step", "pid", "host", "attempt", "start_time", "end_time", "updated_time", ...}
    attempts.json   every (re)start of training: {"attempts": [{"attempt", "start_step", "reason", ...}]};
                    metrics rows and rollout records carry their ``attempt``
                    (:mod:`telescope.recording.run_attempts`: which rows are current)
    logs/           process logs: ``<name>.log``; ``detailed/`` and ``stdout/`` hold the
                    detailed and captured-stdout logs (see :meth:`RunStore.log_path`)

A run written before blocks existed has flat ``events.jsonl`` and ``rollouts.jsonl``;
:class:`~telescope.recording.run_reader.RunReader` still reads them (before any blocks).

Design:

- Events and rollouts are the volume (millions of events, rollouts of kilobytes each):
  they go through :class:`~telescope.recording.block_writer.BlockStream`. The caller only
  queues a record; one writer thread (:class:`~telescope.recording.block_writer.Flusher`)
  appends the queued records to the open block's JSON Lines tail every
  ``event_upload_interval_seconds`` (one JSON encoding a record: the only Python work
  per record) and seals blocks into Parquet in Arrow, without the GIL
  (:mod:`telescope.recording.block_format` says why Parquet and how records map to
  columns). Rollouts arrive as one batch per step, so :meth:`RunStore.set_status` (which
  the recorder calls when a step is recorded) asks the thread to write them at once,
  without waiting: a step's rollouts are on disk milliseconds after its status, not an
  interval later. (Asking in ``log_rollouts`` itself would start the writer while the
  step's thread still has Python work to do, and the two would contend for the GIL.) :meth:`RunStore.flush` writes
  everything now; :meth:`RunStore.close` writes everything and seals the last blocks, so a
  finished run is all Parquet, and a resumed run starts new blocks after the old ones.
- Metrics, evals (one small record per step) are appended synchronously to JSON Lines
  files by :class:`~telescope.recording.jsonl.JsonlWriter`: whole lines, flushed, so a
  crash leaves at most one partial *last* line, which readers skip.
- ``config.*``, ``status.json`` and ``_meta.json`` are replaced atomically (temporary file
  + ``os.replace``): a reader sees the old or the new file, never half.
- Values are made JSON-safe (:func:`~telescope.recording.jsonl.to_jsonable`): numpy scalars
  and arrays become numbers and lists, other objects their ``str``, NaN and inf ``null``.

Limits: a record is serialised on the writer thread, after the call that logged it: do not
mutate a logged event or rollout record (:func:`group_records` builds fresh ones). A crash
(kill -9) loses the events of at most the last flush interval; everything flushed stays
readable, and the next writer on the directory seals the crashed run's open block. There
is no ``fsync`` (a power loss may lose more). Only one process should write a run
directory at a time (the orchestrator; other processes hand their events to it, see
:func:`telescope.api.events.publish`); nothing enforces it.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from telescope.api import events as telescope_events
from telescope.api.records import Group, Rollout, Turn
from telescope.recording.attachments import attachment_entry, store_attachments
from telescope.recording.block_format import EVENTS_SCHEMA, ROLLOUTS_SCHEMA
from telescope.recording.block_writer import BlockStream, Clock, Flusher
from telescope.recording.jsonl import (
    JsonlWriter,
    RunStoreClosedError,
    dumps_line,
    to_jsonable,
    write_atomic,
)
from telescope.recording.run_attempts import ATTEMPT_FIELD, AttemptReason, record_attempt

if TYPE_CHECKING:
    from telescope.schema.config import TelescopeConfig

__all__ = [
    "FINAL_STATUSES",
    "RUN_STATUSES",
    "JsonlWriter",
    "RunStatus",
    "RunStore",
    "RunStoreClosedError",
    "discarded_records",
    "dumps_line",
    "group_records",
    "resolve_run_dir",
    "resolve_run_dir_from_config",
    "rollout_record",
    "to_jsonable",
    "write_atomic",
]

RunStatus = Literal["running", "completed", "failed", "interrupted"]
RUN_STATUSES: tuple[str, ...] = ("running", "completed", "failed", "interrupted")
#: Statuses after which the run is over (``end_time`` is set).
FINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "interrupted"})

CONFIG_YAML = "config.yaml"
CONFIG_JSON = "config.json"
METRICS_FILE = "metrics.jsonl"
EVALS_FILE = "evals.jsonl"
STATUS_FILE = "status.json"
LOGS_DIR = "logs"
EVENTS_DIR = "events"
ROLLOUTS_DIR = "rollouts"
#: The flat files of runs written before blocks existed (still read, never written).
LEGACY_EVENTS_FILE = "events.jsonl"
LEGACY_ROLLOUTS_FILE = "rollouts.jsonl"

#: Defaults of the config's logging fields of the same names.
DEFAULT_EVENT_BLOCK_DURATION_S = 1800.0
DEFAULT_EVENT_UPLOAD_INTERVAL_S = 5.0
DEFAULT_EVENT_TAIL_WINDOW_S = 60.0
DEFAULT_ROLLOUT_BLOCK_SIZE = 500
#: Events queued beyond this (the disk cannot keep up) are dropped and counted.
MAX_PENDING_EVENTS = 1_000_000

LogKind = Literal["main", "detailed", "stdout"]

log = logging.getLogger(__name__)

_RESERVED_METRIC_KEYS = frozenset({"step", "time", ATTEMPT_FIELD})


# ----------------------------------------------------------------------- records


def rollout_record(
    rollout: Rollout,
    *,
    step: int,
    group_index: int,
    rollout_index: int = 0,
    advantage: float | None = None,
) -> dict[str, Any]:
    """The ``rollouts.jsonl`` object for one rollout.

    Fields: ``step``, ``group_index``, ``rollout_index`` (position in its group),
    ``sample_id``, ``environment``, ``prompt`` (text or chat messages), ``completion``
    (generated text of all turns), ``messages``, ``reward``, ``advantage``,
    ``sample_metrics``, ``policy_version`` (oldest dispatch version) and
    ``policy_versions`` (one per turn), ``stop_reason`` (finish reason of the last
    turn), ``num_turns``, ``prompt_tokens``, ``completion_tokens`` (summed over turns),
    ``total_tokens`` (the whole sequence, environment turns included), ``turns`` (per
    turn: ``input_tokens`` added before it, the prompt or the environment's reply;
    ``output_tokens`` generated; its ``policy_version`` and ``finish_reason``: the
    trajectory is these tokens in order, each turn's request the whole trajectory before
    it; ``versions``: its generated tokens' policy versions, run-length encoded),
    ``segment_turns`` (the same per turn of each earlier context segment of a compacted
    episode), ``error`` (the rollout's or the reward function's), ``filtered`` (the output
    filters that masked its loss: ``overlong``, ``gibberish``, ``repetition``; empty
    when trained on) and ``overlong_penalty`` (added to ``reward`` for its advantage;
    0 when none); ``segments`` (how many earlier context segments a compacted episode has;
    the fields above are of its last one) and ``segment_tokens`` (their tokens),
    ``compactions`` and ``compaction_failures``; ``agent_calls`` for an agent episode (its model calls
    in order, each with the ``sequence`` it trains in: see :class:`~telescope.api.records.Rollout`);
    ``tags`` when the sample has some (``Sample.metadata["tags"]``: a dict of name to value, or a list
    of names), which the dashboard filters its metrics by; ``attachments`` when its environment
    kept files with it (their bytes, until the store writes them: :mod:`telescope.recording.attachments`).
    """
    reward = rollout.reward
    tags = rollout.sample.metadata.get("tags") if isinstance(rollout.sample.metadata, dict) else None
    return {
        "step": step,
        "group_index": group_index,
        "rollout_index": rollout_index,
        "sample_id": rollout.sample.sample_id,
        "environment": rollout.sample.environment,
        "prompt": rollout.sample.prompt,
        "completion": rollout.completion_text,
        "messages": rollout.messages,
        "reward": reward.total_reward if reward is not None else None,
        "advantage": advantage,
        "sample_metrics": dict(reward.sample_metrics) if reward is not None else {},
        "policy_version": rollout.oldest_policy_version if rollout.turns else None,
        "policy_versions": [turn.policy_version for turn in rollout.turns],
        "stop_reason": rollout.finish_reason,
        "num_turns": len(rollout.turns),
        "prompt_tokens": rollout.prompt_length,
        "completion_tokens": rollout.completion_length,
        "total_tokens": len(rollout.token_ids),
        "turns": [turn_record(t) for t in rollout.turns],
        "segment_turns": [[turn_record(t) for t in segment] for segment in rollout.segments],
        "error": rollout.error or (reward.error if reward is not None else None),
        "filtered": list(rollout.filtered),
        "overlong_penalty": rollout.overlong_penalty,
        "segments": len(rollout.segments),
        "segment_tokens": sum(len(t.input_token_ids) + len(t.output_token_ids) for s in rollout.segments for t in s),
        "compactions": rollout.compactions,
        "compaction_failures": len(rollout.compaction_failures),
        **({"tags": tags} if tags else {}),
        **({"agent_calls": rollout.agent_calls} if rollout.agent_calls else {}),
        **({"attachments": [attachment_entry(a) for a in rollout.attachments]} if rollout.attachments else {}),
    }


def turn_record(turn: Turn) -> dict[str, Any]:
    """A turn's token counts, dispatch version, finish reason, and its tokens' versions as runs.

    ``versions`` is ``[[version, count], ...]`` in token order: the weights that produced each
    generated token, run-length encoded (one run unless a request spanned a weight update).
    """
    runs: list[list[int]] = []
    for version in turn.token_versions:
        if runs and runs[-1][0] == version:
            runs[-1][1] += 1
        else:
            runs.append([version, 1])
    return {
        "input_tokens": len(turn.input_token_ids),
        "output_tokens": len(turn.output_token_ids),
        "policy_version": turn.policy_version,
        "finish_reason": turn.finish_reason,
        "versions": runs,
    }


def group_records(
    step: int, groups: Iterable[Group], advantages: Mapping[tuple[int, int], float] | None = None
) -> list[dict[str, Any]]:
    """:func:`rollout_record` for every rollout of ``groups``, numbered by group.

    ``advantages`` maps (group index, rollout index) to the advantage the rollout
    was trained with (from the training batch).
    """
    advantages = advantages or {}
    return [
        rollout_record(
            rollout,
            step=step,
            group_index=group_index,
            rollout_index=rollout_index,
            advantage=advantages.get((group_index, rollout_index)),
        )
        for group_index, group in enumerate(groups)
        for rollout_index, rollout in enumerate(group.rollouts)
    ]


def discarded_records(step: int, dropped: Iterable[tuple[str, Sequence[Rollout]]]) -> list[dict[str, Any]]:
    """:func:`rollout_record` for every rollout the orchestrator dropped at ``step``, with its
    ``discard_reason`` (``zero_advantage``, ``max_async``, ``too_few_samples``, ``error``).

    ``dropped`` holds (reason, one group's dropped rollouts), see
    :attr:`telescope.recording.rollout_metrics.DiscardLog.dropped`; the groups are numbered
    in that order (their own numbering, apart from the trained groups').
    """
    records = []
    for group_index, (reason, rollouts) in enumerate(dropped):
        for rollout_index, rollout in enumerate(rollouts):
            record = rollout_record(rollout, step=step, group_index=group_index, rollout_index=rollout_index)
            record["discard_reason"] = reason
            records.append(record)
    return records


# ------------------------------------------------------------------------- store


class RunStore:
    """Writes one run directory. Every method is thread-safe.

    Typical use by the orchestrator::

        store = RunStore.from_config(run_dir, config)
        store.write_config(loaded.render(), config.model_dump(mode="json"))
        store.set_status("running", step=0)
        unsubscribe = store.capture_events()
        ...
        store.log_rollouts(step, group_records(step, groups))
        store.log_metrics(step, metrics)
        ...
        store.set_status("completed", step=step)
        store.close()   # also stops capturing events
    """

    def __init__(
        self,
        run_dir: Path | str,
        *,
        event_block_duration_seconds: float = DEFAULT_EVENT_BLOCK_DURATION_S,
        event_upload_interval_seconds: float = DEFAULT_EVENT_UPLOAD_INTERVAL_S,
        event_tail_window_seconds: float = DEFAULT_EVENT_TAIL_WINDOW_S,
        rollout_block_size: int = DEFAULT_ROLLOUT_BLOCK_SIZE,
        clock: Clock = time.time,
    ) -> None:
        """``clock`` (UNIX seconds) dates blocks and flushes; tests inject one."""
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        self._metrics = JsonlWriter(self.run_dir / METRICS_FILE)
        self._evals = JsonlWriter(self.run_dir / EVALS_FILE)
        interval = float(event_upload_interval_seconds)
        self._events = BlockStream(
            self.run_dir / EVENTS_DIR,
            EVENTS_SCHEMA,
            block_seconds=float(event_block_duration_seconds),
            clock=clock,
            index=True,
            max_pending=MAX_PENDING_EVENTS,
            settings={
                "event_block_duration_seconds": event_block_duration_seconds,
                "event_upload_interval_seconds": interval,
                "event_tail_window_seconds": event_tail_window_seconds,
            },
        )
        self._rollouts = BlockStream(
            self.run_dir / ROLLOUTS_DIR,
            ROLLOUTS_SCHEMA,
            block_rows=int(rollout_block_size),
            clock=clock,
            settings={"rollout_block_size": rollout_block_size, "event_upload_interval_seconds": interval},
        )
        self._flusher = Flusher([self._events, self._rollouts], interval, name=f"run-store-writer:{self.run_dir.name}")
        self._status_lock = threading.Lock()
        self._status: dict[str, Any] = self._read_existing_status()
        self._unsubscribers: list[Callable[[], None]] = []
        self._closed = False
        #: the attempt this store's rows belong to (:meth:`begin_attempt`); ``None`` before one began
        self.attempt: int | None = None
        self._atexit = _flush_at_exit(weakref.ref(self))
        atexit.register(self._atexit)

    @classmethod
    def from_config(cls, run_dir: Path | str, config: TelescopeConfig) -> RunStore:
        """A store with the config's block and flush settings (its logging section)."""
        return cls(
            run_dir,
            event_block_duration_seconds=config.event_block_duration_seconds,
            event_upload_interval_seconds=config.event_upload_interval_seconds,
            event_tail_window_seconds=config.event_tail_window_seconds,
            rollout_block_size=config.rollout_block_size,
        )

    # ------------------------------------------------------------------ paths

    @property
    def logs_dir(self) -> Path:
        return self.run_dir / LOGS_DIR

    def log_path(self, name: str, kind: LogKind = "main") -> Path:
        """Where a process writes its log: ``logs/<name>.log``, ``logs/detailed/<name>.log``
        or ``logs/stdout/<name>.log``. The W&B logger uploads these by kind."""
        folder = self.logs_dir if kind == "main" else self.logs_dir / kind
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{name}.log"

    # ----------------------------------------------------------------- writes

    def write_config(self, text: str, data: Mapping[str, Any]) -> None:
        """Store the resolved config: ``text`` as config.yaml, ``data`` as config.json."""
        self._check_open()
        write_atomic(self.run_dir / CONFIG_YAML, text if text.endswith("\n") else text + "\n")
        write_atomic(self.run_dir / CONFIG_JSON, json.dumps(to_jsonable(data), indent=2, allow_nan=False) + "\n")

    def begin_attempt(self, start_step: int, reason: AttemptReason) -> int:
        """Record a (re)start of training at ``start_step`` in ``attempts.json``; returns its number.

        The rows written from now on carry it, and the rows an earlier attempt wrote for
        ``start_step`` and later read as abandoned (:mod:`telescope.recording.run_attempts`).
        """
        self._check_open()
        had_rows = (self.run_dir / METRICS_FILE).exists() and (self.run_dir / METRICS_FILE).stat().st_size > 0
        attempt = record_attempt(self.run_dir, start_step, reason, had_rows=had_rows)
        self.attempt = attempt.attempt
        with self._status_lock:
            self._status[ATTEMPT_FIELD] = attempt.attempt
        return attempt.attempt

    def log_metrics(self, step: int, metrics: Mapping[str, Any], *, timestamp: float | None = None) -> None:
        """Append one step's metrics; ``step``, ``time`` and ``attempt`` are reserved keys."""
        clashing = _RESERVED_METRIC_KEYS & set(metrics)
        if clashing:
            raise ValueError(f"metric names {sorted(clashing)} are reserved by the run store; rename them")
        record: dict[str, Any] = {"step": int(step), "time": time.time() if timestamp is None else timestamp}
        if self.attempt is not None:
            record[ATTEMPT_FIELD] = self.attempt
        record.update(metrics)
        self._metrics.write(record)

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        """One step's metrics (the recorder's sink interface; :meth:`log_metrics` with the current time)."""
        self.log_metrics(step, metrics)

    def log_rollouts(self, step: int, records: Iterable[Mapping[str, Any] | Rollout]) -> None:
        """Queue rollout records (from :func:`rollout_record` / :func:`group_records`).

        They are written at the next :meth:`set_status` (the end of the step), flush
        interval, :meth:`flush` or :meth:`close`, whichever comes first; their attachments'
        files now (:meth:`store_attachments`). A bare
        :class:`Rollout` is converted with group index ``-1`` (unknown); a dict
        without ``step`` gets ``step``. Each gets the store's ``attempt`` once one began.
        """
        lines: list[Mapping[str, Any]] = []
        tag = {ATTEMPT_FIELD: self.attempt} if self.attempt is not None else {}
        for record in records:
            if isinstance(record, Rollout):
                lines.append({**rollout_record(record, step=step, group_index=-1), **tag})
            elif "step" in record:
                lines.append({**record, **tag})
            else:
                lines.append({"step": int(step), **record, **tag})
        self._rollouts.put_many(self.store_attachments(lines))

    def store_attachments(self, records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``records`` with their attachments written under ``media/`` (:mod:`telescope.recording.attachments`)."""
        return store_attachments(self.run_dir, records)

    def log_event(self, event: Mapping[str, Any]) -> None:
        """Queue one timeline event (what :meth:`capture_events` subscribes): no I/O here.

        It is written with the next flush (every ``event_upload_interval_seconds``).
        """
        self._events.put(dict(event))

    def log_eval(self, name: str, step: int, metrics: Mapping[str, Any], **extra: Any) -> None:
        """Append one eval result: ``{"name", "step", "time", "metrics": {...}, **extra}``."""
        record: dict[str, Any] = {"name": name, "step": int(step), "time": time.time(), "metrics": dict(metrics)}
        record.update(extra)
        self._evals.write(record)

    def capture_events(self) -> Callable[[], None]:
        """Write every :func:`telescope.api.events.emit` event to ``events/`` from now on.

        Returns the function that stops it (``close`` also stops it). A write that fails
        (the store closed meanwhile) is dropped by the event bus, never raised at the emitter.
        """
        self._check_open()
        unsubscribe = telescope_events.subscribe(self.log_event)
        with self._status_lock:
            self._unsubscribers.append(unsubscribe)
        return unsubscribe

    def set_status(self, status: RunStatus, **info: Any) -> dict[str, Any]:
        """Record the run's status in status.json (atomically) and return the new content.

        ``info`` (``step``, ``error``, ...) is merged into the previous content. The store
        fills ``pid``, ``host``, ``start_time`` (first call), ``updated_time`` and, for
        completed/failed/interrupted, ``end_time``; a new ``running`` clears ``end_time``
        (a resumed run).
        """
        if status not in RUN_STATUSES:
            raise ValueError(f"unknown run status {status!r}; use one of {', '.join(RUN_STATUSES)}")
        now = time.time()
        with self._status_lock:
            content = dict(self._status)
            content.update(info)
            content["status"] = status
            content["pid"] = os.getpid()
            content["host"] = socket.gethostname()
            if content.get("start_time") is None:
                content["start_time"] = now
            content["updated_time"] = now
            if status in FINAL_STATUSES:
                content["end_time"] = now
            else:
                content["end_time"] = None
            write_atomic(self.run_dir / STATUS_FILE, json.dumps(to_jsonable(content), indent=2) + "\n")
            self._status = content
        if self._rollouts.pending:  # a step is recorded: its rollouts are written now, not an interval later
            self._flusher.request(self._rollouts)
        return dict(content)

    def flush(self) -> None:
        """Write every queued event and rollout now (in the caller's thread), sealing due blocks."""
        self._events.flush()
        self._rollouts.flush()

    @property
    def dropped_events(self) -> int:
        """Events dropped because the queue was full (the disk could not keep up)."""
        return self._events.dropped

    def close(self) -> None:
        """Stop capturing events, write everything queued, seal the last blocks and close the files.

        Later writes raise :class:`RunStoreClosedError`; closing twice does nothing.
        """
        with self._status_lock:
            unsubscribers, self._unsubscribers = self._unsubscribers, []
            was_closed, self._closed = self._closed, True
        for unsubscribe in unsubscribers:
            unsubscribe()
        if was_closed:
            return
        atexit.unregister(self._atexit)
        self._flusher.stop()
        try:
            self._events.close()
            self._rollouts.close()
        finally:
            self._metrics.close()
            self._evals.close()
        if self._events.dropped:
            log.warning("the run store dropped %d events: its queue was full", self._events.dropped)

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---------------------------------------------------------------- helpers

    def _check_open(self) -> None:
        if self._closed:
            raise RunStoreClosedError(f"the run store of {self.run_dir} is closed")

    def _read_existing_status(self) -> dict[str, Any]:
        """The previous status.json of a resumed run (its start_time is kept), else empty."""
        try:
            content = json.loads((self.run_dir / STATUS_FILE).read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return {}
        return content if isinstance(content, dict) else {}


def _flush_at_exit(ref: weakref.ref[RunStore]) -> Callable[[], None]:
    """At interpreter exit, write what an unclosed store still queues (the writer thread is a daemon)."""

    def flush() -> None:
        store = ref()
        if store is not None and not store._closed:
            with contextlib.suppress(Exception):  # nothing to report to at exit
                store.flush()

    return flush


# -------------------------------------------------------------------- run dir


def resolve_run_dir(
    run_dir: str | Path | None,
    run_name: str,
    *,
    resume: bool = False,
    runs_root: str | Path = "runs",
) -> Path:
    """The directory a run writes to, created if needed.

    ``run_dir`` (the config's ``run_dir``) when set, else ``<runs_root>/<run_name>``
    (``runs/<wandb_run_name>``). When resuming, that directory is used as it is. Otherwise
    an existing non-empty directory is never reused: the first free ``<dir>-1``,
    ``<dir>-2``, ... is taken instead, so a new run never mixes its files with an old
    one's. An existing empty directory is used as is. The free name is claimed with
    ``mkdir`` (which fails if another process took it first), so two runs started at
    once get different directories.
    """
    if run_dir is not None and str(run_dir).strip():
        base = Path(run_dir).expanduser()
    else:
        if not run_name or run_name in {".", ".."} or "/" in run_name or "\\" in run_name:
            raise ValueError(f"run name {run_name!r} cannot name a directory; set run_dir or a plain wandb_run_name")
        base = Path(runs_root) / run_name
    if resume:
        base.mkdir(parents=True, exist_ok=True)
        return base
    base.parent.mkdir(parents=True, exist_ok=True)
    candidate = base
    suffix = 0
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            if candidate.is_dir() and not any(candidate.iterdir()):
                return candidate
        suffix += 1
        candidate = base.with_name(f"{base.name}-{suffix}")


def resolve_run_dir_from_config(config: Any, *, runs_root: str | Path = "runs") -> Path:
    """:func:`resolve_run_dir` for a :class:`~telescope.schema.config.TelescopeConfig`.

    Resuming means ``resume_from_checkpoint`` is true or a step number (0 included).
    """
    resume_setting = config.resume_from_checkpoint
    resume = resume_setting is not False and resume_setting is not None
    return resolve_run_dir(config.run_dir, config.wandb_run_name, resume=resume, runs_root=runs_root)
