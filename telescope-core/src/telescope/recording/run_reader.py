"""Read a run directory, also while its run is still writing it.

:class:`RunReader` reads the files of :mod:`telescope.recording.run_store`. It never locks or
modifies them, and never returns a half-written record:

- ``metrics.jsonl`` and ``evals.jsonl`` are read up to their last newline: bytes after it
  are a line still being written (or cut short by a crash) and are left out. A complete
  line that is not a JSON object (a partial line a crash left in the middle of a file) is
  skipped and counted in :attr:`JsonlFollower.skipped_lines`.
- ``events/`` and ``rollouts/`` are block streams, read by
  :class:`~telescope.recording.block_reader.StreamReader`: sealed Parquet blocks, then the
  open block's JSON Lines tail, preceded by the flat ``events.jsonl`` / ``rollouts.jsonl``
  of a run written before blocks existed.

A consumer with its own Parquet engine (the dashboard's DuckDB) polls
:meth:`RunReader.read_chunks_since` instead: the same walk, nothing parsed into dicts.

For a consumer that polls, :meth:`RunReader.read_events_since` and
:meth:`RunReader.read_rollouts_since` take a
:class:`~telescope.recording.block_reader.StreamCursor` and return only the records after
it (reading only new blocks and the tail from a byte offset) with the new cursor; nothing
is lost or repeated when a block is sealed between or during calls. :meth:`RunReader.follow`
wraps the same in an object with ``read_new()``. :meth:`RunReader.event_tail` returns the
events of the last ``event_tail_window_seconds`` cheaply, for live views.

After a trainer restart or a resume, the rows of re-trained steps that the abandoned
attempt wrote are left out of ``metrics()``, ``latest_metrics()``, ``rollouts()`` and
``read_rollouts_since()`` unless asked for (``include_abandoned``; see
:mod:`telescope.recording.run_attempts`). Followers (:meth:`RunReader.follow`) and chunks
return every row as written, with its ``attempt``: their consumer filters with
:meth:`RunReader.superseded`, which can grow while it reads.

Limits: ``metrics()``, ``evals()`` and the full-stream reads (``events()``, ``rollouts()``)
read everything on each call; poll with cursors instead. A JSON Lines file that is
truncated or replaced under a follower is read again from its start.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from telescope.recording.block_format import EVENTS_SCHEMA, META_FILE, ROLLOUTS_SCHEMA
from telescope.recording.block_reader import Chunk, RecordFilter, StreamCursor, StreamReader
from telescope.recording.jsonl import parse_lines
from telescope.recording.run_attempts import Attempt, current_rows, read_attempts, superseded_from
from telescope.recording.run_metadata import CODE_DIR, METADATA_FILE
from telescope.recording.run_store import (
    CONFIG_JSON,
    CONFIG_YAML,
    DEFAULT_EVENT_TAIL_WINDOW_S,
    EVALS_FILE,
    EVENTS_DIR,
    LEGACY_EVENTS_FILE,
    LEGACY_ROLLOUTS_FILE,
    METRICS_FILE,
    ROLLOUTS_DIR,
    STATUS_FILE,
)

__all__ = [
    "Chunk",
    "Follower",
    "JsonlFollower",
    "RecordFilter",
    "RunReader",
    "StreamCursor",
    "StreamFollower",
    "read_jsonl",
]

Record = dict[str, Any]


class Follower(Protocol):
    """An incremental reader: each ``read_new()`` returns the records added since the last call."""

    @property
    def skipped_lines(self) -> int: ...

    def read_new(self) -> list[Record]: ...


class JsonlFollower:
    """Incremental reader of one JSON Lines file: each :meth:`read_new` returns new complete records."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.skipped_lines = 0

    def read_new(self) -> list[Record]:
        """Records of the complete lines appended since the last call (empty if none or no file)."""
        try:
            with self.path.open("rb") as handle:
                size = handle.seek(0, 2)
                if size < self.offset:  # truncated or replaced: start again
                    self.offset = 0
                handle.seek(self.offset)
                data = handle.read(size - self.offset)
        except FileNotFoundError:
            return []
        records, consumed, skipped = parse_lines(data)
        self.offset += consumed
        self.skipped_lines += skipped
        return records


@dataclass
class StreamFollower:
    """Incremental reader of a block stream (``events`` or ``rollouts``) through a cursor."""

    reader: StreamReader
    cursor: StreamCursor | None = None

    @property
    def skipped_lines(self) -> int:
        return self.reader.skipped_lines

    def read_new(self) -> list[Record]:
        """The records written since the last call (all of them at the first call)."""
        records, self.cursor = self.reader.read_since(self.cursor)
        return records


def read_jsonl(path: Path) -> list[Record]:
    """Every complete record of a JSON Lines file (``[]`` when it does not exist)."""
    return JsonlFollower(path).read_new()


def _discarded(records: list[Record], discarded: bool | None) -> list[Record]:
    """The trained rollout records (``False``), the dropped ones (``True``, with a ``discard_reason``) or all."""
    if discarded is None:
        return records
    return [record for record in records if (record.get("discard_reason") is not None) is discarded]


class RunReader:
    """Reads one run directory (see :mod:`telescope.recording.run_store` for the layout)."""

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir)

    def exists(self) -> bool:
        """Whether this looks like a run directory (it has a status or a metrics file)."""
        return (self.run_dir / STATUS_FILE).exists() or (self.run_dir / METRICS_FILE).exists()

    def attempts(self) -> list[Attempt]:
        """Every (re)start of training the run recorded (``attempts.json``; ``[]`` for an older run)."""
        return read_attempts(self.run_dir)

    def superseded(self) -> dict[int, int]:
        """Per attempt a later one went back on, the first step of its abandoned rows
        (:func:`~telescope.recording.run_attempts.superseded_from`)."""
        return superseded_from(self.attempts())

    def metrics(self, *, include_abandoned: bool = False) -> list[Record]:
        """Per-step metric records in file order: those of the current attempt, or with
        ``include_abandoned`` every row written (each carries its ``attempt``)."""
        records = read_jsonl(self.run_dir / METRICS_FILE)
        return records if include_abandoned else current_rows(records, self.superseded())

    def latest_metrics(self) -> dict[int, Record]:
        """The current record of each step (the last one written, when a step was written twice)."""
        return {int(record["step"]): record for record in self.metrics() if "step" in record}

    def rollouts(
        self, step: int | None = None, *, discarded: bool | None = False, include_abandoned: bool = False
    ) -> list[Record]:
        """Rollout records in the order they were logged, all or those of one ``step``: the
        trained ones (``discarded=False``), the dropped ones, which have a ``discard_reason``
        (``True``), or both (``None``); those of the current attempt, or with
        ``include_abandoned`` every record (each carries its ``attempt``)."""
        records = _discarded(self._rollouts().read_all(RecordFilter(step=step)), discarded)
        return records if include_abandoned else current_rows(records, self.superseded())

    def read_rollouts_since(
        self,
        cursor: StreamCursor | None = None,
        *,
        step: int | None = None,
        discarded: bool | None = False,
        include_abandoned: bool = False,
    ) -> tuple[list[Record], StreamCursor]:
        """The rollouts logged after ``cursor`` (from the start when ``None``), trained,
        dropped or both as in :meth:`rollouts`, and the next cursor; the abandoned ones left
        out unless ``include_abandoned`` (as known at this call: a later attempt can make
        records already returned abandoned, see :meth:`superseded`)."""
        records, cursor = self._rollouts().read_since(cursor, RecordFilter(step=step))
        records = _discarded(records, discarded)
        return (records if include_abandoned else current_rows(records, self.superseded())), cursor

    def events(
        self,
        kind: str | None = None,
        *,
        since: float | None = None,
        until: float | None = None,
        step: int | None = None,
    ) -> list[Record]:
        """Timeline events in the order they were written, filtered (see
        :class:`~telescope.recording.block_reader.RecordFilter`): ``kind`` equals it or starts with
        ``kind + '.'``; the event overlaps ``[since, until)``; its ``step`` equals ``step``."""
        return self._events().read_all(RecordFilter(kind=kind, since=since, until=until, step=step))

    def read_events_since(
        self,
        cursor: StreamCursor | None = None,
        *,
        kind: str | None = None,
        since: float | None = None,
        until: float | None = None,
        step: int | None = None,
    ) -> tuple[list[Record], StreamCursor]:
        """The events written after ``cursor`` (from the start when ``None``) that match the
        filters, and the next cursor (past every event read, matching or not)."""
        return self._events().read_since(cursor, RecordFilter(kind=kind, since=since, until=until, step=step))

    def read_chunks_since(
        self, name: str, cursor: StreamCursor | None = None, *, max_bytes: int | None = None
    ) -> tuple[list[Chunk], int]:
        """The data of block stream ``name`` (``events`` or ``rollouts``) after ``cursor``, unparsed
        (see :meth:`~telescope.recording.block_reader.StreamReader.chunks_since`), and the count
        of bad tail lines skipped by this call. For consumers that read Parquet themselves."""
        if name not in ("events", "rollouts"):
            raise ValueError(f"{name!r} is not a block stream; use events or rollouts")
        reader = self._events() if name == "events" else self._rollouts()
        chunks = reader.chunks_since(cursor, max_bytes=max_bytes)
        return chunks, reader.skipped_lines

    def event_tail(
        self, seconds: float | None = None, *, kind: str | None = None, now: float | None = None
    ) -> list[Record]:
        """The events that ended in the last ``seconds`` before ``now`` (default: the run's
        ``event_tail_window_seconds``, and the current time), read cheaply from the open block."""
        if seconds is None:
            seconds = float(self.recording_settings().get("event_tail_window_seconds", DEFAULT_EVENT_TAIL_WINDOW_S))
        now = time.time() if now is None else now
        return self._events().tail_window(now - seconds, RecordFilter(kind=kind, until=now))

    def recording_settings(self) -> Record:
        """The block and flush settings the run store recorded (empty for a run without blocks)."""
        settings: Record = {}
        for directory in (ROLLOUTS_DIR, EVENTS_DIR):
            settings.update(_read_json_object(self.run_dir / directory / META_FILE) or {})
        settings.pop("stream", None)
        return settings

    def evals(self, name: str | None = None) -> list[Record]:
        """Eval results, all or those of the eval ``name``."""
        records = read_jsonl(self.run_dir / EVALS_FILE)
        if name is None:
            return records
        return [record for record in records if record.get("name") == name]

    def status(self) -> Record | None:
        """The content of status.json, or ``None`` before the run wrote it."""
        return _read_json_object(self.run_dir / STATUS_FILE)

    def config(self) -> Record | None:
        """The resolved config (config.json), or ``None`` before the run wrote it."""
        return _read_json_object(self.run_dir / CONFIG_JSON)

    def metadata(self) -> Record | None:
        """metadata.json (environments and their metric ranges, host, git, the code snapshot's
        summary; see :mod:`telescope.recording.run_metadata`), or ``None`` before the run wrote it."""
        return _read_json_object(self.run_dir / METADATA_FILE)

    @property
    def code_dir(self) -> Path:
        """The folder of the run's code snapshot (it may not exist)."""
        return self.run_dir / CODE_DIR

    def code_files(self) -> list[str]:
        """The files of the code snapshot, as sorted paths relative to :attr:`code_dir` (``[]`` without one)."""
        if not self.code_dir.is_dir():
            return []
        return sorted(p.relative_to(self.code_dir).as_posix() for p in self.code_dir.rglob("*") if p.is_file())

    def config_text(self) -> str | None:
        """The resolved config as YAML text, or ``None`` before the run wrote it."""
        try:
            return (self.run_dir / CONFIG_YAML).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def logs(self) -> list[Path]:
        """Every file under logs/, sorted."""
        logs_dir = self.run_dir / "logs"
        if not logs_dir.is_dir():
            return []
        return sorted(path for path in logs_dir.rglob("*") if path.is_file())

    def follow(self, name: str) -> Follower:
        """An incremental reader of ``metrics``, ``rollouts``, ``events`` or ``evals``."""
        if name == "events":
            return StreamFollower(self._events())
        if name == "rollouts":
            return StreamFollower(self._rollouts())
        files = {"metrics": METRICS_FILE, "evals": EVALS_FILE}
        if name not in files:
            raise ValueError(f"no stream {name!r} in a run directory; use one of metrics, rollouts, events, evals")
        return JsonlFollower(self.run_dir / files[name])

    def _events(self) -> StreamReader:
        return StreamReader(self.run_dir / EVENTS_DIR, EVENTS_SCHEMA, self.run_dir / LEGACY_EVENTS_FILE)

    def _rollouts(self) -> StreamReader:
        return StreamReader(self.run_dir / ROLLOUTS_DIR, ROLLOUTS_SCHEMA, self.run_dir / LEGACY_ROLLOUTS_FILE)


def _read_json_object(path: Path) -> Record | None:
    """A JSON object file written atomically; ``None`` when absent (or not an object)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return value if isinstance(value, dict) else None
