"""Reading a block stream (see :mod:`telescope.recording.block_format`), also while it is written.

:class:`StreamReader` reads a stream's sealed Parquet blocks and its open JSON Lines tail
in block order, preceded by the flat ``events.jsonl`` / ``rollouts.jsonl`` of a run
directory written before blocks existed (read as block ``-1``). A tail is read up to its
last newline, so a line still being written is never returned. It never locks or changes
a file.

Incremental reading: :meth:`StreamReader.read_since` takes a :class:`StreamCursor` (block
number, records read in it, bytes read of its tail) and returns only what came after it,
reading only new data: later blocks and the tail from the byte offset. Because a sealed
block holds exactly its tail's records in the same order, a cursor that stopped inside a
tail continues in the sealed block at the same record, so nothing is lost or returned
twice when the writer seals a block between two calls, or during one (the writer creates
the block file before it deletes the tail, and the reader checks for the block file again
when a tail vanishes). A tail is left behind only when a later block exists (an orphan of
a crashed writer, or the legacy file); blocks that are missing are skipped.

For a consumer with its own engine (the dashboard's DuckDB), :meth:`StreamReader.chunks_since`
walks the same way but parses nothing: it names the sealed blocks (and how many of their
rows were read already) and gives a tail's new lines as an Arrow table of the block's
columns, each with the cursor after it.

Filters (:class:`RecordFilter`: ``kind`` prefix, a time range, a step) run on Arrow before
records become Python dicts; on a full read of a block they are pushed into the Parquet
reader, which skips row groups by their statistics.

:meth:`StreamReader.tail_window` returns the events that ended in the last seconds: from
the open tail it reads only the flushes made since the cut-off (the tail's index gives
their byte offsets; an event is flushed after it ends), and earlier blocks only while they
were still being written after the cut-off (their ``telescope.sealed_at`` metadata).

Records come back exactly as written: from a block's ``record`` column (one JSON parse
for all the block's matching rows) or from the tail's lines.

Limits: a full read turns every record into a dict (a few seconds per million events on a
slow machine): live consumers should poll with cursors. Reading a sealed block from a
cursor inside it reads the whole block (once per block and consumer). The live tail
assumes the writer's and the emitters' clocks agree (one machine, or synchronised clocks).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from telescope.recording.block_format import (
    RECORD_COLUMN,
    StreamSchema,
    block_path,
    index_path,
    list_blocks,
    tail_path,
)
from telescope.recording.jsonl import Record, parse_lines

LEGACY_SEQ = -1


@dataclass(frozen=True)
class StreamCursor:
    """A position in a stream: block ``seq`` (``-1``: the legacy flat file), ``rows`` records
    read of it and, while it is a tail, ``offset`` bytes. JSON-able with ``dataclasses.asdict``."""

    seq: int = LEGACY_SEQ
    rows: int = 0
    offset: int = 0


@dataclass(frozen=True)
class Chunk:
    """New data of a stream, unparsed (:meth:`StreamReader.chunks_since`): rows ``skip:`` of the
    sealed block ``path`` (a Parquet file of the stream's :attr:`~StreamSchema.arrow_schema`),
    or ``table``, new complete lines of a tail as a table of the same columns. ``cursor`` is
    the position after it."""

    cursor: StreamCursor
    path: Path | None = None
    skip: int = 0
    table: pa.Table | None = None


@dataclass(frozen=True)
class _Piece:
    """One step of :meth:`StreamReader._walk`: sealed block ``seq`` read from ``start.rows``
    (``data`` is ``None``), or the bytes ``data`` of its tail from ``start``. ``next_cursor``
    is where the stream continues after it, or ``None`` when that depends on how much of
    ``data`` was taken (the open block)."""

    seq: int
    start: StreamCursor
    data: bytes | None
    next_cursor: StreamCursor | None

    def after(self, rows: int, consumed: int) -> StreamCursor:
        """The cursor after this piece, given the records and bytes taken of ``data``."""
        if self.next_cursor is not None:
            return self.next_cursor
        return StreamCursor(self.seq, self.start.rows + rows, self.start.offset + consumed)


@dataclass(frozen=True)
class RecordFilter:
    """Which records to return: all the given conditions hold.

    ``kind``: the event kind equals it or starts with ``kind + '.'``. ``since``/``until``:
    the event overlaps ``[since, until)`` (``start < until`` and ``start + duration_s >=
    since``; records without a numeric ``start`` are left out). ``step``: equal step.
    """

    kind: str | None = None
    since: float | None = None
    until: float | None = None
    step: int | None = None

    @property
    def is_empty(self) -> bool:
        return self.kind is None and self.since is None and self.until is None and self.step is None

    def expression(self) -> pc.Expression | None:
        """The filter as an Arrow expression over the stream's columns."""
        parts: list[pc.Expression] = []
        if self.kind is not None:
            kind = pc.field("kind")
            parts.append((kind == self.kind) | pc.starts_with(kind, self.kind + "."))
        if self.since is not None:
            duration = pc.field("duration_s")
            end = pc.field("start") + pc.if_else(duration.is_null(), 0.0, duration)
            parts.append(end >= self.since)
        if self.until is not None:
            parts.append(pc.field("start") < self.until)
        if self.step is not None:
            parts.append(pc.field("step") == self.step)
        if not parts:
            return None
        combined = parts[0]
        for part in parts[1:]:
            combined = combined & part
        return combined

    def matches(self, record: Record) -> bool:
        """The same test on one record (for records read from a tail)."""
        if self.kind is not None:
            kind = record.get("kind")
            if not isinstance(kind, str) or not (kind == self.kind or kind.startswith(self.kind + ".")):
                return False
        if self.since is not None or self.until is not None:
            start = _number(record.get("start"))
            if start is None:
                return False
            if self.until is not None and not start < self.until:
                return False
            if self.since is not None and not start + (_number(record.get("duration_s")) or 0.0) >= self.since:
                return False
        return self.step is None or (type(record.get("step")) is int and record.get("step") == self.step)


def _number(value: object) -> float | None:
    return float(value) if type(value) in (int, float) else None  # type: ignore[arg-type]


class StreamReader:
    """Reads one stream directory (plus its legacy flat file, if any)."""

    def __init__(self, directory: Path, schema: StreamSchema, legacy: Path | None = None) -> None:
        self.directory = directory
        self.schema = schema
        self.legacy = legacy
        #: Complete tail lines that were not JSON objects (a crash's partial line), so far.
        self.skipped_lines = 0

    # ------------------------------------------------------------------- reads

    def read_all(self, where: RecordFilter | None = None) -> list[Record]:
        """Every record (that matches ``where``) in stream order."""
        return self.read_since(None, where)[0]

    def read_since(
        self, cursor: StreamCursor | None = None, where: RecordFilter | None = None
    ) -> tuple[list[Record], StreamCursor]:
        """The records after ``cursor`` (all from the start when ``None``) and the new cursor.

        The cursor advances over every record read, matching ``where`` or not.
        """
        cursor = cursor or StreamCursor()
        where = where if where is not None and not where.is_empty else None
        out: list[Record] = []
        for piece in self._walk(cursor):
            if piece.data is None:
                out.extend(self._read_block(piece.seq, piece.start.rows, where) or [])
                cursor = piece.after(0, 0)
                continue
            records, consumed, skipped = parse_lines(piece.data)
            self.skipped_lines += skipped
            out.extend(self._filter(records, where))
            cursor = piece.after(len(records), consumed)
        return out, cursor

    def chunks_since(self, cursor: StreamCursor | None = None, *, max_bytes: int | None = None) -> list[Chunk]:
        """What :meth:`read_since` would return, as :class:`Chunk` s that are not parsed into records.

        For a consumer that reads the blocks with its own engine (the dashboard's DuckDB):
        a sealed block is only named (its path and the rows of it already read); the new
        complete lines of a tail come as a table of the block's columns (parsed by Arrow,
        see :meth:`~telescope.recording.block_format.StreamSchema.table_from_lines`). Each
        chunk carries the cursor after it, so a consumer may stop after any chunk. A tail
        read is cut at ``max_bytes`` (at a line end); the list then ends with it.
        """
        cursor = cursor or StreamCursor()
        chunks: list[Chunk] = []
        for piece in self._walk(cursor, max_bytes):
            if piece.data is None:
                chunks.append(
                    Chunk(piece.after(0, 0), path=block_path(self.directory, piece.seq), skip=piece.start.rows)
                )
                continue
            cut = piece.data.rfind(b"\n") + 1
            table = self.schema.table_from_lines(piece.data[:cut]) if cut else None
            rows = table.num_rows if table is not None else 0
            if rows != piece.data.count(b"\n", 0, cut):  # bad (or blank) lines were left out
                self.skipped_lines += sum(1 for line in piece.data[:cut].split(b"\n") if line.strip()) - rows
            after = piece.after(rows, cut)
            if rows or after != cursor:
                chunks.append(Chunk(after, table=table if rows else None))
            cursor = after
        return chunks

    def tail_window(self, since: float, where: RecordFilter | None = None) -> list[Record]:
        """The events that ended at or after ``since`` (and match ``where``), cheaply for live views."""
        where = RecordFilter(
            kind=where.kind if where else None,
            since=since,
            until=where.until if where else None,
            step=where.step if where else None,
        )
        expression = where.expression()
        parts: list[list[Record]] = []
        listing = list_blocks(self.directory)
        for seq in reversed(listing.seqs):
            if seq not in listing.sealed:
                read = self._read_tail_window(seq, since)
                if read is not None:
                    records, first_flush = read
                    parts.append(self._filter(records, where))
                    if first_flush is not None and first_flush < since:
                        break  # earlier blocks were all written before the cut-off
                    continue
            try:
                metadata = pq.read_metadata(block_path(self.directory, seq)).metadata or {}
                table = pq.read_table(block_path(self.directory, seq), columns=[RECORD_COLUMN], filters=expression)
            except FileNotFoundError:
                continue
            sealed_at = _float_meta(metadata, b"telescope.sealed_at")
            if sealed_at is not None and sealed_at < since:
                break
            parts.append(self.schema.to_records(table))
            opened_at = _float_meta(metadata, b"telescope.opened_at")
            if opened_at is not None and opened_at < since:
                break
        return [record for part in reversed(parts) for record in part]

    # ---------------------------------------------------------------- helpers

    def _filter(self, records: list[Record], where: RecordFilter | None) -> list[Record]:
        return records if where is None else [r for r in records if where.matches(r)]

    def _read_block(self, seq: int, skip: int, where: RecordFilter | None) -> list[Record] | None:
        """The records of sealed block ``seq`` after the first ``skip``; ``None`` if it is not sealed."""
        if seq < 0:
            return None
        path = block_path(self.directory, seq)
        expression = where.expression() if where is not None else None
        try:
            if skip == 0:  # the filter is pushed into the reader, which skips row groups by their statistics
                table = pq.read_table(path, columns=[RECORD_COLUMN], filters=expression)
            else:
                table = pq.read_table(path).slice(skip)
                if expression is not None:
                    table = table.filter(expression)
        except FileNotFoundError:
            return None
        return self.schema.to_records(table)

    def _tail_file(self, seq: int) -> Path | None:
        if seq == LEGACY_SEQ:
            return self.legacy
        return tail_path(self.directory, seq)

    def _walk(self, cursor: StreamCursor, max_bytes: int | None = None) -> Iterator[_Piece]:
        """The pieces of the stream after ``cursor``, in order: sealed blocks (to read from a
        row) and the bytes of tails (see the module docstring for why nothing is lost or
        repeated when the writer seals a block meanwhile). A tail read cut at ``max_bytes``
        ends the walk."""
        while True:
            seq = cursor.seq
            if self._is_sealed(seq):
                piece = _Piece(seq, cursor, None, StreamCursor(seq + 1))
                yield piece
                cursor = piece.next_cursor  # type: ignore[assignment]
                continue
            read = self._read_tail(seq, cursor, max_bytes)
            later = [s for s in list_blocks(self.directory).seqs if s > seq]
            if read is None:  # no tail: sealed just now, or a gap
                if self._is_sealed(seq):
                    continue
                if later:
                    cursor = StreamCursor(later[0])
                    continue
                return
            data, start, cut_short = read
            if cut_short or not later:  # the open block (or a tail read in parts): the cursor stays in it
                yield _Piece(seq, start, data, None)
                return
            # a later block exists, so this tail is complete: sealed meanwhile, an orphan, or the legacy file
            if self._is_sealed(seq):
                yield _Piece(seq, cursor, None, StreamCursor(later[0]))
            else:
                yield _Piece(seq, start, data, StreamCursor(later[0]))
            cursor = StreamCursor(later[0])

    def _is_sealed(self, seq: int) -> bool:
        return seq >= 0 and block_path(self.directory, seq).is_file()

    def _read_tail(
        self, seq: int, cursor: StreamCursor, max_bytes: int | None = None
    ) -> tuple[bytes, StreamCursor, bool] | None:
        """(the bytes of tail ``seq`` after ``cursor``, where they start, whether ``max_bytes``
        cut them short); ``None`` when there is no such file. A tail shorter than the cursor's
        offset (replaced or truncated under us) is read again from its start."""
        path = self._tail_file(seq)
        if path is None:
            return None
        try:
            with path.open("rb") as handle:
                size = handle.seek(0, 2)
                start = cursor if size >= cursor.offset else StreamCursor(seq)
                handle.seek(start.offset)
                want = size - start.offset
                data = handle.read(want if max_bytes is None else min(want, max_bytes))
                while max_bytes is not None and len(data) < want and b"\n" not in data:  # one line over max_bytes
                    data += handle.read(max_bytes)
        except FileNotFoundError:
            return None
        return data, StreamCursor(seq, start.rows, start.offset), len(data) < want

    def _read_tail_window(self, seq: int, since: float) -> tuple[list[Record], float | None] | None:
        """Records of tail ``seq`` flushed at or after ``since``, and the time of its first flush."""
        offset, first_flush = 0, None
        try:
            lines = index_path(self.directory, seq).read_bytes().splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            fields = line.split()
            if len(fields) != 3:
                continue  # a line being written
            flushed_at, end = float(fields[0]), int(fields[1])
            if first_flush is None:
                first_flush = flushed_at
            if flushed_at < since:
                offset = end
        read = self._read_tail(seq, StreamCursor(seq, 0, offset))
        if read is None:
            return None
        records, _, skipped = parse_lines(read[0])
        self.skipped_lines += skipped
        return records, first_flush


def _float_meta(metadata: dict[bytes, bytes], key: bytes) -> float | None:
    raw = metadata.get(key)
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None
