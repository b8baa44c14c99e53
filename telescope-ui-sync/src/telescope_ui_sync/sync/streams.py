"""Incremental, resumable reading of a run directory's streams, through :class:`RunReader`.

A stream returns what was appended since its position and can report and restore that
position as JSON (persisted by the syncer with the rows it wrote, in one transaction).
The run reader knows the files, so a change of the run store's on-disk format does not
break the dashboard:

- ``metrics`` and ``evals`` are JSON Lines (``RunReader.follow(name)`` gives a follower
  with the file's ``path``): :class:`JsonlStream` reads at most ``max_bytes`` per call from
  the saved byte offset, up to the last complete line (a line still being written is left
  for the next call); lines that are not JSON objects are skipped and counted. The file's
  inode is part of the position: a file that was replaced, or truncated below the offset,
  is read again from its start and the stream reports ``reset`` so the syncer drops what
  it had.
- ``events`` and ``rollouts`` are block streams: :class:`ChunkStream` takes the reader's
  chunks (:meth:`RunReader.read_chunks_since`: sealed Parquet blocks by name, a tail's new
  lines as an Arrow table) and keeps the reader's cursor, so DuckDB reads the blocks itself
  (see :mod:`.ingest`) and nothing is parsed row by row in Python.

Log files are plain text and are read by :class:`TextTail` (same offset logic, lines).
A file that does not exist yet simply gives nothing; it is read when it appears.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from telescope.recording.jsonl import parse_lines
from telescope.recording.run_reader import Chunk, RunReader, StreamCursor

Record = dict[str, Any]

DEFAULT_MAX_BYTES = 64 * 1024 * 1024


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


class _FileTail:
    """The byte-offset bookkeeping shared by JSON Lines and text files."""

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.offset = 0
        self.inode: int | None = None
        self.skipped = 0
        self.reset = False
        self._pending_reset = False

    def read_complete_lines(self) -> bytes:
        """The bytes of the complete lines after the offset (at most ``max_bytes``, at least one line)."""
        self.reset, self._pending_reset = self._pending_reset, False
        try:
            handle = self.path.open("rb")
        except FileNotFoundError:
            return b""
        with handle:
            stat = os.fstat(handle.fileno())
            if (self.inode is not None and stat.st_ino != self.inode) or stat.st_size < self.offset:
                self.offset = 0
                self.reset = True
            self.inode = stat.st_ino
            if stat.st_size == self.offset:
                return b""
            handle.seek(self.offset)
            data = handle.read(min(stat.st_size - self.offset, self.max_bytes))
            end = data.rfind(b"\n")
            while end < 0 and self.offset + len(data) < stat.st_size:  # one line longer than max_bytes
                more = handle.read(self.max_bytes)
                if not more:
                    break
                data += more
                end = data.rfind(b"\n")
        if end < 0:  # only a line still being written
            return b""
        self.offset += end + 1
        return data[: end + 1]

    def position(self) -> dict[str, Any]:
        return {"type": "offset", "offset": self.offset, "inode": self.inode, "skipped": self.skipped}

    def restore(self, position: dict[str, Any]) -> None:
        if position.get("type") == "offset":
            self.offset = int(position.get("offset", 0))
            self.inode = position.get("inode")
            self.skipped = int(position.get("skipped", 0))
            if self.inode is not None and _inode(self.path) not in (None, self.inode):
                self.offset, self.inode, self._pending_reset = 0, None, True


class JsonlStream(_FileTail):
    """A JSON Lines file read in bounded chunks from a byte offset (see the module docstring)."""

    def read_lines(self) -> list[bytes]:
        """The new complete lines (blank ones left out), unparsed; the consumer counts bad ones in :attr:`skipped`."""
        data = self.read_complete_lines()
        return [line for line in data.split(b"\n") if line and not line.isspace()]

    def parse(self, lines: list[bytes]) -> list[Record]:
        """``lines`` as records; lines that are not JSON objects are skipped and counted."""
        records, _, skipped = parse_lines(b"\n".join(lines) + b"\n")
        self.skipped += skipped
        return records


class TextTail(_FileTail):
    """A text file (a log) read line by line from a byte offset; counts the lines read."""

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__(path, max_bytes)
        self.lines = 0

    def read_lines(self) -> tuple[int, list[str]]:
        """(number of the first line returned, counted from 0; the new complete lines)."""
        data = self.read_complete_lines()
        if self.reset:
            self.lines = 0
        lines = data.decode("utf-8", errors="replace").split("\n")[:-1] if data else []
        first = self.lines
        self.lines += len(lines)
        return first, lines

    def position(self) -> dict[str, Any]:
        return {**super().position(), "lines": self.lines}

    def restore(self, position: dict[str, Any]) -> None:
        super().restore(position)
        self.lines = 0 if self._pending_reset else int(position.get("lines", 0))


class ChunkStream:
    """A block stream (``events``, ``rollouts``) read through
    :meth:`RunReader.read_chunks_since`: chunks that name sealed Parquet blocks or hold a
    tail's new lines as an Arrow table, each with the reader's cursor after it.

    The position holds that cursor, the number the next record gets (``next_seq``) and the
    bad tail lines skipped so far. :meth:`read` does not move it: the syncer calls
    :meth:`advance` for what it wrote, in the transaction that wrote it.
    """

    def __init__(self, reader: RunReader, name: str, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.reader = reader
        self.name = name
        self.max_bytes = max_bytes
        self.cursor: StreamCursor | None = None
        self.next_seq = 0
        self.skipped = 0
        self.reset = False
        self._pending_reset = False

    def read(self) -> list[Chunk]:
        """The chunks after the cursor (a tail's lines at most ``max_bytes`` at a time)."""
        self.reset, self._pending_reset = self._pending_reset, False
        if self.reset:
            self.cursor, self.next_seq, self.skipped = None, 0, 0
        chunks, skipped = self.reader.read_chunks_since(self.name, self.cursor, max_bytes=self.max_bytes)
        self.skipped += skipped
        return chunks

    def advance(self, cursor: StreamCursor, records: int) -> dict[str, Any]:
        """Move past ``records`` records to ``cursor``; returns the new position (to save)."""
        self.cursor = cursor
        self.next_seq += records
        return self.position()

    def position(self) -> dict[str, Any]:
        cursor = dataclasses.asdict(self.cursor) if self.cursor is not None else None
        return {"type": "chunks", "cursor": cursor, "next_seq": self.next_seq, "skipped": self.skipped}

    def restore(self, position: dict[str, Any]) -> None:
        try:
            if position.get("type") != "chunks":
                raise TypeError("written by another reader")
            fields = position.get("cursor")
            self.cursor = StreamCursor(**fields) if fields is not None else None
            self.next_seq = int(position.get("next_seq", 0))
            self.skipped = int(position.get("skipped", 0))
        except (TypeError, ValueError):  # another kind of position, or the cursor's fields changed: start again
            self.cursor, self.next_seq, self.skipped = None, 0, 0
            self._pending_reset = True


def open_stream(reader: RunReader, name: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> JsonlStream | ChunkStream:
    """The stream ``name`` (metrics, rollouts, events, evals) of ``reader``'s run."""
    if name in ("events", "rollouts"):
        return ChunkStream(reader, name, max_bytes)
    follower = reader.follow(name)
    path = getattr(follower, "path", None)
    if not isinstance(path, Path):
        raise TypeError(f"the run reader's {name} follower has no file path")
    return JsonlStream(path, max_bytes)
