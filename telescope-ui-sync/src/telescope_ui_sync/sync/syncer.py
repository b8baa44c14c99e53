"""The incremental syncer of one run directory, and the service that watches folders of runs.

:class:`RunSyncer` copies one run directory into the database. Each :meth:`RunSyncer.sync_once`
reads only what was appended since the last pass (see :mod:`.streams`), writes it with the
stream's new position in one transaction (the volume through DuckDB itself, see
:mod:`.ingest`), and refreshes the run's row (status, config, metadata) when status.json
changed. A stream the run has not created yet gives nothing until it appears; a
half-written last line waits for the next pass; a corrupt line is skipped and counted
(``runs.skipped_lines``); a sealed block that cannot be read is skipped, named and read
again only when its file changes (:mod:`.bad_blocks`); a run directory that disappears
marks the run ``missing`` (its synced data stays viewable) and is synced again if it comes back.

:class:`SyncService` discovers runs: each root is a run directory itself or a folder whose
sub-directories are runs (checked again on every pass, so new runs appear while the server
runs); W&B runs too, when wandb is installed (:mod:`.wandb_source`). A background thread
runs a pass every ``poll_interval`` seconds; a pass over runs with nothing new costs a few
``stat`` calls each.

A run that restarted its trainer or was resumed shows its current attempt only
(:mod:`telescope.recording.run_attempts`): metrics lines and rollout rows that a later attempt
abandoned are left out, and when a new attempt appears the run's metrics are read again and
its abandoned rollout rows deleted (they stay in the run directory). A ``running`` run whose
process is gone shows ``died`` (:func:`~telescope.recording.run_liveness.run_state`).

Limits: a resumed run that writes a step again replaces that step's metrics; events and
evals are appended as written (a resumed run may repeat some). Runs are synced
one after the other in one thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from telescope.recording.run_attempts import is_abandoned
from telescope.recording.run_liveness import run_state
from telescope.recording.run_reader import Chunk, RunReader
from telescope_ui_sync.sync import ingest, wandb_source
from telescope_ui_sync.sync import records as rec
from telescope_ui_sync.sync.bad_blocks import BadBlocks
from telescope_ui_sync.sync.base import PassResult, Syncer
from telescope_ui_sync.sync.schema import delete_run
from telescope_ui_sync.sync.streams import ChunkStream, JsonlStream, TextTail, open_stream

log = logging.getLogger(__name__)


class RunStillPresent(RuntimeError):
    """A run asked to be forgotten still has its directory (it would be synced again)."""


STREAMS: tuple[str, ...] = ("metrics", "rollouts", "events", "evals")
#: What a stream's rows are deleted from when the stream starts again from its beginning.
STREAM_TABLES: dict[str, tuple[str, ...]] = {
    "metrics": ("metrics", "steps"),
    "rollouts": ("rollouts",),
    "events": ("events", "event_bins", "system_metrics"),
    "evals": ("evals",),
}
#: The saved position that records which attempts the synced rows were filtered by.
ATTEMPTS_KEY = "attempts"
#: Seconds between two listings of the W&B projects' runs (the API source).
API_LIST_S = 30.0
#: A pass reads a stream at most this many times (a run written faster than it is read
#: cannot keep the pass, and the runs after it, waiting).
MAX_READS_PER_PASS = 100
#: Sealed blocks read by one statement (one transaction): at most this many files, this many bytes.
BATCH_FILES = 64
BATCH_BYTES = 32 * 1024 * 1024
#: What reading a block may raise when the file is bad (truncated, corrupt, unreadable).
BLOCK_ERRORS = (OSError, pa.ArrowException, duckdb.Error)


def _batches(chunks: Sequence[Chunk]) -> list[list[Chunk]]:
    """Consecutive sealed blocks grouped (at most BATCH_FILES files and BATCH_BYTES bytes a group); a tail alone."""
    batches: list[list[Chunk]] = []
    size = 0
    for chunk in chunks:
        if chunk.path is None:
            batches.append([chunk])
            continue
        try:
            bytes_ = chunk.path.stat().st_size
        except FileNotFoundError:
            bytes_ = 0
        current = batches[-1] if batches else None
        if current is None or current[0].path is None or len(current) >= BATCH_FILES or size + bytes_ > BATCH_BYTES:
            batches.append([chunk])
            size = bytes_
        else:
            current.append(chunk)
            size += bytes_
    return batches


def run_id_for(path: Path) -> str:
    """A stable, URL-safe id: the directory name and a hash of its absolute path."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", path.name)[:80] or "run"
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:6]
    return f"{name}-{digest}"


def is_run_dir(path: Path) -> bool:
    """A run directory: what :meth:`RunReader.exists` says, or one holding a config written by a run."""
    if not path.is_dir():
        return False
    return RunReader(path).exists() or (path / "config.json").is_file()


def discover(roots: Iterable[Path]) -> list[tuple[Path, Path]]:
    """(run directory, root) for each run under ``roots``: a root that is a run, or its sub-directories."""
    found: list[tuple[Path, Path]] = []
    for root in roots:
        if is_run_dir(root):
            found.append((root, root))
            continue
        try:
            children = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        found.extend((child, root) for child in children if is_run_dir(child))
    return found


def current_lines(lines: list[bytes], superseded: dict[int, int]) -> list[bytes]:
    """The metrics lines that no later attempt abandoned (a line that is not JSON is kept, to be counted)."""
    if not superseded:
        return lines
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            kept.append(line)
            continue
        if not (isinstance(record, dict) and is_abandoned(record, superseded)):
            kept.append(line)
    return kept


class RunSyncer(Syncer):
    """Syncs one run directory into the database (see the module docstring)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_dir: Path, root: Path | None = None) -> None:
        super().__init__(con, run_id_for(run_dir), run_dir.name, str(run_dir), str(root or run_dir))
        self.run_dir = run_dir
        self.root = root or run_dir
        self.reader = RunReader(run_dir)
        self._status_text: str | None = None
        self._shown_status: str | None = None
        self._superseded: dict[int, int] = {}  # what the synced rows were filtered by (see _apply_attempts)
        self._has_config = False
        self.streams: dict[str, JsonlStream | ChunkStream] = {}
        self.next_eval_seq = 0
        self.log_tails: dict[str, TextTail] = {}
        self.log_times: dict[str, float | None] = {}
        self.bad_blocks = BadBlocks(con, self.run_id, run_dir)
        self._stream_errors: dict[str, str] = {}
        self._restore()

    # ----------------------------------------------------------------- state

    def _restore(self) -> None:
        saved = self.saved_positions()
        for name in STREAMS:
            stream = open_stream(self.reader, name)
            if name in saved:
                stream.restore(saved[name])
            self.streams[name] = stream
        row = self.con.execute("SELECT max(seq) FROM evals WHERE run_id = ?", [self.run_id]).fetchone()
        self.next_eval_seq = (row[0] + 1) if row and row[0] is not None else 0
        applied = saved.get(ATTEMPTS_KEY, {}).get("superseded", {})
        self._superseded = {int(a): int(k) for a, k in applied.items()}
        for key, position in saved.items():
            if key.startswith("log:"):
                relative = key[4:]
                tail = TextTail(self.run_dir / "logs" / relative)
                tail.restore(position)
                self.log_tails[relative] = tail
                self.log_times[relative] = position.get("last_time")

    # ------------------------------------------------------------------ pass

    def sync_once(self) -> PassResult:
        """Read what is new in every stream and write it; never raises for a bad or missing file."""
        result = PassResult()
        if not self.run_dir.is_dir():
            self._set_missing(True, f"run directory {self.run_dir}")
            result.missing = True
            return result
        self._set_missing(False)
        self._refresh_run_row()
        self._apply_attempts()  # before the streams: a new attempt's rows follow its record
        for name in STREAMS:
            result.rows[name] = self._sync_stream(name)
        result.rows["logs"] = self._sync_logs()
        skipped = sum(stream.skipped for stream in self.streams.values())
        self.con.execute(
            "UPDATE runs SET last_sync = ?, skipped_lines = ? WHERE run_id = ?", [time.time(), skipped, self.run_id]
        )
        return result

    def _refresh_run_row(self) -> None:
        """The run's row, when status.json changed or the run's process died (a ``running`` status
        whose process is gone reads ``died``: :func:`~telescope.recording.run_liveness.run_state`)."""
        status = self.reader.status()
        status_text = json.dumps(status, sort_keys=True) if status is not None else None
        shown = run_state(status).status if status is not None else None
        if status_text == self._status_text and shown == self._shown_status and self._has_config:
            return
        self._status_text, self._shown_status = status_text, shown
        config = self.reader.config()
        self._has_config = config is not None
        metadata = self.reader.metadata()
        status = status or {}
        number_of_steps = (config or {}).get("number_of_steps")
        self.con.execute(
            "UPDATE runs SET status = ?, step = ?, start_time = ?, end_time = ?, updated_time = ?, "
            "number_of_steps = ?, status_json = ?, config_json = ?, config_yaml = ?, metadata_json = ?, "
            "name = ? WHERE run_id = ?",
            [
                shown,
                rec._integer(status.get("step")),
                rec._number(status.get("start_time")),
                rec._number(status.get("end_time")),
                rec._number(status.get("updated_time")),
                rec._integer(number_of_steps),
                status_text,
                json.dumps(config) if config is not None else None,
                self.reader.config_text(),
                json.dumps(metadata) if metadata is not None else None,
                self.run_dir.name,
                self.run_id,
            ],
        )

    def _apply_attempts(self) -> None:
        """When the run recorded a new attempt: read its metrics again (the abandoned lines left
        out) and delete the rollout rows it abandoned."""
        superseded = self.reader.superseded()
        if superseded == self._superseded:
            return
        with self._transaction():
            self._delete("metrics")
            self.streams["metrics"] = open_stream(self.reader, "metrics")
            self._save_cursor("metrics", self.streams["metrics"].position())
            ingest.drop_abandoned_rollouts(self.con, self.run_id, superseded)
            self._save_cursor(ATTEMPTS_KEY, {"superseded": {str(a): k for a, k in superseded.items()}})
        self._superseded = superseded

    def _sync_stream(self, name: str) -> int:
        stream = self.streams[name]
        try:
            if isinstance(stream, ChunkStream):
                added = self._sync_blocks(name, stream)
            else:
                added = self._sync_jsonl(name, stream)
        except BLOCK_ERRORS as exc:  # one bad file must not stop the others; tried again next pass
            message = str(exc)
            if self._stream_errors.get(name) != message:  # logged once, not on every pass
                log.warning("reading %s of %s failed: %s", name, self.run_dir, message)
            self._stream_errors[name] = message
            return 0
        self._stream_errors.pop(name, None)
        return added

    def _sync_jsonl(self, name: str, stream: JsonlStream) -> int:
        """``metrics`` or ``evals``: bounded reads from the saved offset until nothing is new."""
        added = 0
        while True:
            lines = stream.read_lines()
            if not lines and not stream.reset:
                return added
            with self._transaction():
                if stream.reset:
                    self._delete(name)
                if name == "metrics":
                    table, records, bad = ingest.metrics_long(self.run_id, current_lines(lines, self._superseded))
                    stream.skipped += bad
                    ingest.replace_steps(self.con, self.run_id, table)
                else:
                    evals = stream.parse(lines)
                    ingest.append(self.con, "evals", rec.eval_columns(self.run_id, self.next_eval_seq, evals))
                    self.next_eval_seq += len(evals)
                    records = len(evals)
                self._save_cursor(name, stream.position())
            added += records
            if not lines:
                return added

    def _sync_blocks(self, name: str, stream: ChunkStream) -> int:
        """``rollouts`` or ``events``: DuckDB reads the new blocks (a batch of files per statement).

        A batch that fails is read again block by block; a sealed block that cannot be read
        alone is skipped and remembered (:mod:`.bad_blocks`), so the rest of the run shows
        and the block is not read again until its file changes.
        """
        added = self._retry_bad_blocks(name, stream)
        for _ in range(MAX_READS_PER_PASS):
            chunks = stream.read()
            if stream.reset:
                with self._transaction():
                    self._delete(name)
                    self._save_cursor(name, stream.position())
            if not chunks:
                return added
            for batch in _batches(chunks):
                try:
                    added += self._insert_batch(name, stream, batch)
                except BLOCK_ERRORS:
                    if batch[0].path is None:  # a tail (still being written): tried again next pass
                        raise
                    added += self._insert_one_by_one(name, stream, batch)
        return added

    def _insert(self, name: str, source: ingest.Source, first_seq: int) -> int:
        insert = ingest.insert_rollouts if name == "rollouts" else ingest.insert_events
        return insert(self.con, self.run_id, source, first_seq)

    def _insert_batch(self, name: str, stream: ChunkStream, batch: list[Chunk]) -> int:
        """Write one batch (sealed blocks, or one tail table) and move the cursor past it, in one transaction."""
        with self._transaction():
            first = batch[0]
            if first.table is not None:
                source = ingest.table_source(self.con, first.table)
                try:
                    records = self._insert(name, source, stream.next_seq)
                finally:
                    self.con.unregister(source.sql)
            elif first.path is not None:
                files = [(chunk.path, chunk.skip) for chunk in batch if chunk.path is not None]
                records = self._insert(name, ingest.parquet_source(files), stream.next_seq)
            else:  # only skipped lines: the cursor moves, nothing to write
                records = 0
            if name == "rollouts":  # rows of an attempt already abandoned when they were read
                ingest.drop_abandoned_rollouts(self.con, self.run_id, self._superseded, stream.next_seq)
            self._save_cursor(name, stream.advance(batch[-1].cursor, records))
        return records

    def _insert_one_by_one(self, name: str, stream: ChunkStream, batch: list[Chunk]) -> int:
        """A failed batch of sealed blocks, block by block; a block that fails alone is skipped and remembered."""
        added = 0
        for chunk in batch:
            try:
                added += self._insert_batch(name, stream, [chunk])
            except BLOCK_ERRORS as exc:
                assert chunk.path is not None
                with self._transaction():
                    self.bad_blocks.add(name, chunk.path, exc)
                    self._save_cursor(name, stream.advance(chunk.cursor, 0))
        return added

    def _retry_bad_blocks(self, name: str, stream: ChunkStream) -> int:
        """Read again the bad blocks whose file changed; their rows are numbered after those synced."""
        added = 0
        for block in self.bad_blocks.changed(name):
            try:
                with self._transaction():
                    records = self._insert(name, ingest.parquet_source([(block.path, 0)]), stream.next_seq)
                    if name == "rollouts":
                        ingest.drop_abandoned_rollouts(self.con, self.run_id, self._superseded, stream.next_seq)
                    self.bad_blocks.remove(name, block.path)
                    stream.next_seq += records
                    self._save_cursor(name, stream.position())
            except BLOCK_ERRORS as exc:
                with self._transaction():
                    self.bad_blocks.add(name, block.path, exc)
                continue
            log.info(
                "%s block %s of run %s is readable again: %d records synced", name, block.path, self.run_dir, records
            )
            added += records
        return added

    def _delete(self, name: str) -> None:
        """Drop what a stream had written (it starts again from its beginning)."""
        for table in STREAM_TABLES[name]:
            self.con.execute(f"DELETE FROM {table} WHERE run_id = ?", [self.run_id])
        self.bad_blocks.clear(name)

    def _sync_logs(self) -> int:
        logs_dir = self.run_dir / "logs"
        added = 0
        for path in self.reader.logs():
            relative = path.relative_to(logs_dir).as_posix()
            if path.suffix not in (".log", ".txt", ".out", ".err"):
                continue
            tail = self.log_tails.get(relative)
            if tail is None:
                tail = self.log_tails[relative] = TextTail(path)
            first, lines = tail.read_lines()
            if not lines and not tail.reset:
                continue
            component = relative[: -len(path.suffix)]
            table, last_time = rec.log_columns(
                self.run_id, relative, component, first, lines, self.log_times.get(relative)
            )
            self.log_times[relative] = last_time
            with self._transaction():
                if tail.reset:
                    self.con.execute("DELETE FROM logs WHERE run_id = ? AND file = ?", [self.run_id, relative])
                ingest.append(self.con, "logs", table)
                self._save_cursor(f"log:{relative}", {**tail.position(), "last_time": last_time})
            added += len(lines)
        return added


class SyncService:
    """Watches root folders for runs and keeps each one synced (see the module docstring).

    W&B runs (:mod:`.wandb_source`) come in too when wandb is installed: W&B run folders
    under the roots, and with ``wandb_api`` (a ``wandb.Api()``, or a fake of it) the runs
    tagged ``telescope`` of ``wandb_projects``, listed again every :data:`API_LIST_S` seconds.
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        roots: Sequence[Path],
        poll_interval: float = 0.5,
        *,
        wandb_api: Any = None,
        wandb_projects: Sequence[str] = (),
    ) -> None:
        self.con = con
        self.roots = [Path(root) for root in roots]
        self.poll_interval = poll_interval
        self.wandb_api = wandb_api
        self.wandb_projects = list(wandb_projects)
        self.syncers: dict[str, Syncer] = {}
        self.passes = 0
        self.last_error: str | None = None
        #: Per run id, when a pass last added rows (this process's clock; what pages poll on).
        self.changed: dict[str, float] = {}
        self._wandb = wandb_source.wandb_available()
        self._api_listed = -math.inf
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def root_strings(self) -> list[str]:
        return [str(root) for root in self.roots] + [f"wandb:{project}" for project in self.wandb_projects]

    def sync_all(self) -> dict[str, PassResult]:
        """One pass: discover runs, then sync each known run once."""
        with self._lock:
            self._discover()
            results = {}
            for syncer in list(self.syncers.values()):
                try:
                    results[syncer.run_id] = syncer.sync_once()
                    if results[syncer.run_id].total:
                        self.changed[syncer.run_id] = time.time()
                except Exception as exc:  # one broken run must not stop the others
                    self.last_error = f"{syncer.run_id}: {type(exc).__name__}: {exc}"
                    log.exception("syncing %s failed", syncer.run_id)
            self._mark_missing_known_runs()
            self.passes += 1
            return results

    def _discover(self) -> None:
        for run_dir, root in discover(self.roots):
            key = str(run_dir)
            if key not in self.syncers:
                self.syncers[key] = RunSyncer(self.con, run_dir, root)
        if not self._wandb:
            return
        for folder, root in wandb_source.discover_wandb(self.roots, is_run_dir):
            key = f"wandb:{folder}"
            if key not in self.syncers:
                self.syncers[key] = wandb_source.WandbFolderSyncer(self.con, folder, root)
        if self.wandb_api is not None and time.monotonic() - self._api_listed >= API_LIST_S:
            self._api_listed = time.monotonic()
            for run, project in wandb_source.api_runs(self.wandb_api, self.wandb_projects):
                key = f"wandb-api:{project}/{run.id}"
                if key not in self.syncers:
                    self.syncers[key] = wandb_source.WandbApiSyncer(self.con, run, project)

    def _mark_missing_known_runs(self) -> None:
        """Runs synced by an earlier server whose directory is gone are marked missing."""
        if self.passes % 20:
            return
        rows = self.con.execute("SELECT run_id, path, missing FROM runs WHERE source = 'local'").fetchall()
        roots = set(self.root_strings)
        synced = {syncer.run_id for syncer in self.syncers.values()}
        for run_id, path, missing in rows:
            if run_id in synced:
                continue
            gone = not Path(path).is_dir()
            if gone != missing and (str(Path(path).parent) in roots or path in roots):
                self.con.execute("UPDATE runs SET missing = ? WHERE run_id = ?", [gone, run_id])

    def forget(self, run_id: str) -> None:
        """Remove run ``run_id``, whose directory has gone, from the database and stop syncing it.

        Raises :class:`RunStillPresent` when the run's directory (or W&B run) is still there: it
        would be synced again on the next pass. A directory that comes back later is a new run
        to the syncer and is synced from its beginning.
        """
        with self._lock:
            row = self.con.execute("SELECT path, missing FROM runs WHERE run_id = ?", [run_id]).fetchone()
            if row is None:
                raise KeyError(run_id)
            path, missing = row
            if not missing:
                raise RunStillPresent(f"the run's directory {path} is still there; delete it first")
            for key, syncer in list(self.syncers.items()):
                if syncer.run_id == run_id:
                    del self.syncers[key]
            self.changed.pop(run_id, None)
            delete_run(self.con, run_id)

    def start(self) -> None:
        """Sync in a background thread until :meth:`stop`."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="telescope-ui-sync", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sync_all()
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("sync pass failed")
            self._stop.wait(max(0.0, self.poll_interval - (time.monotonic() - started)))

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
