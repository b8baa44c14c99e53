"""The local run store: one directory per run, written by the run, readable while it runs.

Layout of a run directory (``runs/<wandb_run_name>/`` unless ``run_dir`` is set)::

    config.yaml     the resolved config, as text (with provenance comments)
    config.json     the same config as a JSON object
    metrics.jsonl   one object per step: {"step": int, "time": float, <metric>: value, ...}
    rollouts.jsonl  one object per rollout (see :func:`rollout_record` for the fields)
    events.jsonl    timeline events from :mod:`telescope.recording.events` (see :meth:`RunStore.capture_events`)
    evals.jsonl     one object per eval run: {"name", "step", "time", "metrics": {...}, ...}
    status.json     {"status", "step", "pid", "start_time", "end_time", "updated_time", ...}
    logs/           process logs: ``<name>.log``; ``detailed/`` and ``stdout/`` hold the
                    detailed and captured-stdout logs (see :meth:`RunStore.log_path`)

Design:

- JSON Lines files are append-only. Each record is serialised first and written with one
  ``write`` call of a whole line followed by ``flush``, under a per-file lock, so threads
  never interleave and a crash leaves at most one partial *last* line; earlier lines are
  never rewritten. When a file is reopened for appending (a resumed run) and its last
  line is partial, a newline is written first, so the partial line stays a lone bad line
  that readers skip instead of corrupting the next record.
- ``config.*`` and ``status.json`` are replaced atomically (write a temporary file in the
  same directory, then ``os.replace``): a reader sees the old or the new file, never half.
- Values are made JSON-safe: numpy scalars and arrays become numbers and lists, paths and
  other objects their ``str``, and non-finite floats (NaN, inf) become ``null`` so that
  every line is strict JSON that any reader (a browser dashboard) parses.

Limits: ``flush`` hands the data to the operating system; there is no ``fsync``, so a
power loss (not a process crash) may lose the last writes. Only one process should
write a run directory at a time (the orchestrator); nothing enforces it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import IO, Any, Literal

from telescope.api.records import Group, Rollout
from telescope.recording import events as telescope_events

RunStatus = Literal["running", "completed", "failed", "interrupted"]
RUN_STATUSES: tuple[str, ...] = ("running", "completed", "failed", "interrupted")
#: Statuses after which the run is over (``end_time`` is set).
FINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "interrupted"})

CONFIG_YAML = "config.yaml"
CONFIG_JSON = "config.json"
METRICS_FILE = "metrics.jsonl"
ROLLOUTS_FILE = "rollouts.jsonl"
EVENTS_FILE = "events.jsonl"
EVALS_FILE = "evals.jsonl"
STATUS_FILE = "status.json"
LOGS_DIR = "logs"

LogKind = Literal["main", "detailed", "stdout"]

_RESERVED_METRIC_KEYS = frozenset({"step", "time"})


class RunStoreClosedError(RuntimeError):
    """A write was attempted after :meth:`RunStore.close`."""


# --------------------------------------------------------------------------- JSON


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON types; non-finite floats become ``None`` (strict JSON)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(asdict(value))
    # numpy scalars and arrays (without importing numpy): .item() / .tolist()
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return to_jsonable(tolist())
    item = getattr(value, "item", None)
    if callable(item):
        return to_jsonable(item())
    return str(value)


def dumps_line(record: Mapping[str, Any]) -> str:
    """One JSON Lines line (with the trailing newline) for ``record``."""
    return json.dumps(to_jsonable(record), ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (temporary file + ``os.replace``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise


class JsonlWriter:
    """An append-only, thread-safe JSON Lines file: whole lines, flushed on every write."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._handle: IO[str] | None = None
        self._closed = False

    def _open(self) -> IO[str]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        needs_newline = False
        if self.path.exists() and self.path.stat().st_size > 0:
            with self.path.open("rb") as existing:
                existing.seek(-1, os.SEEK_END)
                needs_newline = existing.read(1) != b"\n"
        handle = self.path.open("a", encoding="utf-8")
        if needs_newline:  # isolate a partial line left by a crash
            handle.write("\n")
            handle.flush()
        return handle

    def write(self, record: Mapping[str, Any]) -> None:
        self.write_many([record])

    def write_many(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append records; each line is serialised first, then written whole and flushed."""
        lines = [dumps_line(r) for r in records]
        if not lines:
            return
        with self._lock:
            if self._closed:
                raise RunStoreClosedError(f"cannot write to {self.path}: the run store is closed")
            if self._handle is None:
                self._handle = self._open()
            for line in lines:
                self._handle.write(line)
                self._handle.flush()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._handle is not None:
                self._handle.close()
                self._handle = None


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
    ``total_tokens`` (the whole sequence, environment turns included) and ``error``
    (the rollout's or the reward function's).
    """
    reward = rollout.reward
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
        "error": rollout.error or (reward.error if reward is not None else None),
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


# ------------------------------------------------------------------------- store


class RunStore:
    """Writes one run directory. Every method is thread-safe.

    Typical use by the orchestrator::

        store = RunStore(run_dir)
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

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        self._metrics = JsonlWriter(self.run_dir / METRICS_FILE)
        self._rollouts = JsonlWriter(self.run_dir / ROLLOUTS_FILE)
        self._events = JsonlWriter(self.run_dir / EVENTS_FILE)
        self._evals = JsonlWriter(self.run_dir / EVALS_FILE)
        self._status_lock = threading.Lock()
        self._status: dict[str, Any] = self._read_existing_status()
        self._unsubscribers: list[Callable[[], None]] = []
        self._closed = False

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

    def log_metrics(self, step: int, metrics: Mapping[str, Any], *, timestamp: float | None = None) -> None:
        """Append one step's metrics; ``step`` and ``time`` are reserved keys."""
        clashing = _RESERVED_METRIC_KEYS & set(metrics)
        if clashing:
            raise ValueError(f"metric names {sorted(clashing)} are reserved by the run store; rename them")
        record: dict[str, Any] = {"step": int(step), "time": time.time() if timestamp is None else timestamp}
        record.update(metrics)
        self._metrics.write(record)

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        """One step's metrics (the recorder's sink interface; :meth:`log_metrics` with the current time)."""
        self.log_metrics(step, metrics)

    def log_rollouts(self, step: int, records: Iterable[Mapping[str, Any] | Rollout]) -> None:
        """Append rollout records (from :func:`rollout_record` / :func:`group_records`).

        A bare :class:`Rollout` is converted with group index ``-1`` (unknown); a dict
        without ``step`` gets ``step``.
        """
        lines: list[Mapping[str, Any]] = []
        for record in records:
            if isinstance(record, Rollout):
                lines.append(rollout_record(record, step=step, group_index=-1))
            elif "step" in record:
                lines.append(record)
            else:
                lines.append({"step": int(step), **record})
        self._rollouts.write_many(lines)

    def log_event(self, event: Mapping[str, Any]) -> None:
        """Append one timeline event (what :meth:`capture_events` subscribes)."""
        self._events.write(event)

    def log_eval(self, name: str, step: int, metrics: Mapping[str, Any], **extra: Any) -> None:
        """Append one eval result: ``{"name", "step", "time", "metrics": {...}, **extra}``."""
        record: dict[str, Any] = {"name": name, "step": int(step), "time": time.time(), "metrics": dict(metrics)}
        record.update(extra)
        self._evals.write(record)

    def capture_events(self) -> Callable[[], None]:
        """Write every :func:`telescope.recording.events.emit` event to events.jsonl from now on.

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
            return dict(content)

    def close(self) -> None:
        """Stop capturing events and close the files; later writes raise :class:`RunStoreClosedError`."""
        with self._status_lock:
            unsubscribers, self._unsubscribers = self._unsubscribers, []
            self._closed = True
        for unsubscribe in unsubscribers:
            unsubscribe()
        for writer in (self._metrics, self._rollouts, self._events, self._evals):
            writer.close()

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
    """:func:`resolve_run_dir` for a :class:`~telescope.config.schema.TelescopeConfig`.

    Resuming means ``resume_from_checkpoint`` is true or a step number (0 included).
    """
    resume_setting = config.resume_from_checkpoint
    resume = resume_setting is not False and resume_setting is not None
    return resolve_run_dir(config.run_dir, config.wandb_run_name, resume=resume, runs_root=runs_root)
