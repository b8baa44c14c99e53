"""Writing a block stream (see :mod:`telescope.recording.block_format`) off the hot path.

:class:`BlockStream` is one stream of a run directory (``events/`` or ``rollouts/``).
Producers only :meth:`~BlockStream.put` records on an in-memory queue (a ``deque`` append:
no I/O, no serialisation, no lock on the producer's thread). :meth:`~BlockStream.flush`,
called by the :class:`Flusher` thread every ``flush interval`` (``event_upload_interval_seconds``),
drains the queue: it encodes each record as one JSON line (the C encoder also checks that
it is plain JSON; records that are not go through ``to_jsonable`` first; the GIL is
released every :data:`YIELD_EVERY_RECORDS` records) and appends the lines to the open
block's tail in one write, then, for events, one index line.

A block is sealed when its time is up (``block_seconds`` since its first record, checked
at every flush: blocks end on a flush, so a block covers its window plus at most one
interval) or when it holds ``block_rows`` records (a flush that overflows it is split
exactly). Sealing converts the tail to Parquet chunk by chunk in Arrow (without the GIL,
see :meth:`~telescope.recording.block_format.StreamSchema.table_from_lines`) into a hidden
temporary file, renames it to ``block-<N>.parquet`` and only then deletes the tail, so
every record is at every moment in a whole tail line or in a sealed block, never in
neither; the next records open block ``N+1``.

Crashes: records still queued (at most one flush interval of events) are lost; the tail
keeps every flushed record, perhaps followed by one partial line that readers skip. A new
writer on the same directory (a resumed run) first seals an orphan tail into its block
(complete lines only) and deletes stale temporary files, then opens the next block.
``close`` drains the queue and seals the last block, so a finished run is all Parquet.

Limits: one writer process per directory (nothing enforces it). When the event queue
holds ``max_pending`` records (the disk cannot keep up), further records are dropped and
counted in :attr:`BlockStream.dropped` rather than growing memory without bound.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import pyarrow.parquet as pq

from telescope.recording.block_format import (
    FORMAT_VERSION,
    META_FILE,
    SEAL_CHUNK_BYTES,
    StreamSchema,
    block_path,
    index_path,
    list_blocks,
    tail_path,
)
from telescope.recording.jsonl import (
    RunStoreClosedError,
    dumps_jsonable,
    to_jsonable,
    write_atomic,
)

log = logging.getLogger(__name__)

Clock = Callable[[], float]
PARQUET_COMPRESSION = "zstd"
#: Rows of a Parquet row group: the unit that a time or step filter skips by its statistics.
ROW_GROUP_ROWS = 65_536
#: The writer releases the GIL after encoding this many records. Encoding is pure Python
#: and holds the GIL; a thread of the same process that wants it back (a training loop
#: returning from a GIL-free kernel, an event emitter) would otherwise wait for Python's
#: switch interval (5 ms) each time. 64 records take well under a millisecond to encode.
YIELD_EVERY_RECORDS = 64


class BlockStream:
    """One stream of blocks: a queue in memory, a JSON Lines tail, sealed Parquet blocks."""

    def __init__(
        self,
        directory: Path,
        schema: StreamSchema,
        *,
        block_seconds: float | None = None,
        block_rows: int | None = None,
        clock: Clock = time.time,
        index: bool = False,
        max_pending: int | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        if block_seconds is not None and block_seconds <= 0:
            raise ValueError("block_seconds must be positive")
        if block_rows is not None and block_rows < 1:
            raise ValueError("block_rows must be at least 1")
        self.directory = directory
        self.schema = schema
        self.block_seconds = block_seconds
        self.block_rows = block_rows
        self.clock = clock
        self.index = index
        self.max_pending = max_pending
        self.dropped = 0
        self._pending: deque[Mapping[str, Any]] = deque()
        self._lock = threading.Lock()  # one flush at a time (writer thread or a caller)
        self._closed = False
        self._tail: IO[bytes] | None = None
        self._index: IO[bytes] | None = None
        self._tail_bytes = 0
        self._rows = 0
        self._opened_at: float | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self.seq = self._recover()
        meta = {"format": FORMAT_VERSION, "stream": schema.name, **(settings or {})}
        write_atomic(directory / META_FILE, dumps_jsonable(to_jsonable(meta)) + "\n")

    # --------------------------------------------------------------- producers

    @property
    def pending(self) -> int:
        """Records queued and not yet written."""
        return len(self._pending)

    def put(self, record: Mapping[str, Any]) -> None:
        """Queue one record (kept by reference: do not mutate it afterwards)."""
        if self._closed:
            raise RunStoreClosedError(f"cannot write to {self.directory}: the run store is closed")
        if self.max_pending is not None and len(self._pending) >= self.max_pending:
            self.dropped += 1
            return
        self._pending.append(record)

    def put_many(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Queue records in order, as one batch."""
        if self._closed:
            raise RunStoreClosedError(f"cannot write to {self.directory}: the run store is closed")
        self._pending.extend(records)

    # ------------------------------------------------------------------ writer

    def flush(self) -> None:
        """Write every queued record to the tail and seal the block if its time or size is up."""
        with self._lock:
            if self._closed:
                return
            self._drain()
            opened_at = self._opened_at
            if (
                self.block_seconds is not None
                and opened_at is not None
                and self.clock() - opened_at >= self.block_seconds
            ):
                self._seal()

    def close(self) -> None:
        """Write what is queued, seal the last block; later puts raise :class:`RunStoreClosedError`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._drain()
                self._seal()
            finally:
                self._close_handles()

    def _drain(self) -> None:
        lines: list[str] = []
        pending = self._pending
        with contextlib.suppress(IndexError):
            while True:
                record: Any = pending.popleft()
                try:  # the encoder checks the record is plain JSON: most are, and are not copied
                    lines.append(dumps_jsonable(record))
                except (TypeError, ValueError):  # numpy values, NaN, other objects
                    lines.append(dumps_jsonable(to_jsonable(record)))
                if len(lines) % YIELD_EVERY_RECORDS == 0:
                    time.sleep(0)  # hand the GIL over (see YIELD_EVERY_RECORDS)
        start = 0
        while start < len(lines):
            end = len(lines) if self.block_rows is None else min(len(lines), start + self.block_rows - self._rows)
            self._append(lines[start:end])
            start = end
            if self.block_rows is not None and self._rows >= self.block_rows:
                self._seal()

    def _append(self, lines: list[str]) -> None:
        if self._tail is None:
            self._tail = tail_path(self.directory, self.seq).open("ab")
            self._tail_bytes = self._tail.tell()
        if self._opened_at is None:
            self._opened_at = self.clock()
        lines.append("")
        data = "\n".join(lines).encode("utf-8")
        self._tail.write(data)
        self._tail.flush()
        self._tail_bytes += len(data)
        self._rows += len(lines) - 1
        if self.index:
            if self._index is None:
                self._index = index_path(self.directory, self.seq).open("ab")
            self._index.write(f"{self.clock()!r} {self._tail_bytes} {self._rows}\n".encode())
            self._index.flush()

    def _seal(self) -> None:
        if self._rows == 0:
            self._opened_at = None
            return
        self._close_handles()
        metadata = {"telescope.opened_at": repr(self._opened_at), "telescope.sealed_at": repr(self.clock())}
        seal_tail(self.directory, self.seq, self.schema, metadata)
        self.seq += 1
        self._rows = 0
        self._tail_bytes = 0
        self._opened_at = None

    def _close_handles(self) -> None:
        for handle in (self._tail, self._index):
            if handle is not None:
                handle.close()
        self._tail = self._index = None

    def _recover(self) -> int:
        """Seal orphan tails a crashed writer left, drop stale temporary files; the next block number."""
        for stale in self.directory.glob(".block-*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        listing = list_blocks(self.directory)
        for seq in sorted(listing.tails):
            if seq in listing.sealed:  # sealed, then the crash came before the tail was deleted
                for path in (tail_path(self.directory, seq), index_path(self.directory, seq)):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
            else:
                dropped = seal_tail(self.directory, seq, self.schema, {"telescope.recovered": "1"})
                if dropped:
                    log.warning(
                        "%s: sealed a crashed run's block %d without its partial last line", self.directory, seq
                    )
        seqs = listing.seqs
        return seqs[-1] + 1 if seqs else 0


def seal_tail(directory: Path, seq: int, schema: StreamSchema, metadata: Mapping[str, str]) -> bool:
    """Write block ``seq`` from its tail (complete lines), rename it into place, delete the tail.

    Returns whether bytes after the last newline (a crash's partial line) were left out.
    """
    tail = tail_path(directory, seq)
    temp = directory / f".{block_path(directory, seq).name}.tmp"
    carry = b""
    with tail.open("rb") as source, pq.ParquetWriter(temp, schema.arrow_schema, compression=PARQUET_COMPRESSION) as out:
        while chunk := source.read(SEAL_CHUNK_BYTES):
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            carry = data[cut:]
            if cut:
                out.write_table(schema.table_from_lines(data[:cut]), row_group_size=ROW_GROUP_ROWS)
        out.add_key_value_metadata(dict(metadata))
    os.replace(temp, block_path(directory, seq))
    for path in (tail, index_path(directory, seq)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return bool(carry)


class Flusher:
    """The writer thread of a run store: flushes every stream each ``interval`` seconds,
    and a stream at once when :meth:`request` asks (rollouts arrive as one batch per step).

    A flush that fails (a full disk) is logged once per stream; the thread goes on.
    """

    def __init__(self, streams: Sequence[BlockStream], interval: float, *, name: str = "telescope-run-store") -> None:
        if interval <= 0:
            raise ValueError("the flush interval must be positive")
        self.streams = tuple(streams)
        self.interval = interval
        self._wake = threading.Event()
        self._urgent: set[int] = set()
        self._urgent_lock = threading.Lock()
        self._stopping = False
        self._failed: set[int] = set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def request(self, stream: BlockStream) -> None:
        """Flush ``stream`` soon, without waiting for it."""
        with self._urgent_lock:
            self._urgent.add(self.streams.index(stream))
        self._wake.set()

    def stop(self) -> None:
        """End the thread (after the flush in progress, if any); the caller then closes the streams."""
        self._stopping = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        next_tick = time.monotonic() + self.interval
        while True:
            self._wake.wait(max(0.0, next_tick - time.monotonic()))
            self._wake.clear()
            if self._stopping:
                return
            with self._urgent_lock:
                urgent, self._urgent = self._urgent, set()
            due = time.monotonic() >= next_tick
            for i, stream in enumerate(self.streams):
                if due or i in urgent:
                    self._flush(i, stream)
            if due:
                next_tick = time.monotonic() + self.interval

    def _flush(self, i: int, stream: BlockStream) -> None:
        try:
            stream.flush()
        except Exception:
            if i not in self._failed:
                self._failed.add(i)
                log.exception("run store: writing %s failed", stream.directory)
