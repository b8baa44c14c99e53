"""Incremental, resumable reading of a run directory's streams, through :class:`RunReader`.

A :class:`Stream` returns the records appended since its position and can report and
restore that position as JSON (persisted by the syncer with the rows it wrote). How it
reads depends on what the run reader offers, so a change of the run store's on-disk
format does not break the dashboard:

- JSON Lines (``RunReader.follow(name)`` gives a follower with a ``path`` and an
  ``offset``): :class:`JsonlStream` reads at most ``max_bytes`` per call from the saved
  byte offset, up to the last complete line (a line still being written is left for the
  next call), skipping and counting lines that are not JSON objects. The file's inode is
  part of the position: a file that was replaced, or truncated below the offset, is read
  again from its start and the stream reports ``reset`` so the syncer drops what it had.
- A reader cursor (a follower with a dataclass ``cursor``, as for the columnar block
  streams): :class:`CursorStream` calls ``read_new()`` and saves the cursor's fields.
- Anything else: :class:`CountingStream` re-reads and skips the records already taken
  (correct for any append-only stream; slow, a last resort).

Log files are plain text and are read by :class:`TextTail` (same offset logic, lines).
A file that does not exist yet simply gives nothing; it is read when it appears.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Protocol

from telescope.recording.run_reader import RunReader

Record = dict[str, Any]

DEFAULT_MAX_BYTES = 64 * 1024 * 1024


class Stream(Protocol):
    """New records since the last call, and a JSON position to resume from."""

    reset: bool

    @property
    def skipped(self) -> int: ...

    def read(self) -> list[Record]: ...

    def position(self) -> dict[str, Any]: ...

    def restore(self, position: dict[str, Any]) -> None: ...


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

    def read(self) -> list[Record]:
        data = self.read_complete_lines()
        records: list[Record] = []
        loads = json.loads
        for line in data.split(b"\n"):
            if not line or line.isspace():
                continue
            try:
                value = loads(line)
            except ValueError:
                self.skipped += 1
                continue
            if isinstance(value, dict):
                records.append(value)
            else:
                self.skipped += 1
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


class CursorStream:
    """A run-reader follower that keeps a dataclass cursor (the block streams)."""

    def __init__(self, follower: Any) -> None:
        self.follower = follower
        self.reset = False
        self._pending_reset = False

    @property
    def skipped(self) -> int:
        return int(getattr(self.follower, "skipped_lines", 0))

    def read(self) -> list[Record]:
        self.reset, self._pending_reset = self._pending_reset, False
        return list(self.follower.read_new())

    def position(self) -> dict[str, Any]:
        cursor = self.follower.cursor
        fields = dataclasses.asdict(cursor) if cursor is not None else None
        return {"type": "cursor", "cursor": fields}

    def restore(self, position: dict[str, Any]) -> None:
        fields = position.get("cursor")
        if position.get("type") != "cursor":  # written by another reader: start again
            self._pending_reset = True
            return
        if fields is None:
            return
        cursor_type = _cursor_type()
        try:
            if cursor_type is None:
                raise TypeError("no cursor type")
            self.follower.cursor = cursor_type(**fields)
        except TypeError:  # the cursor's fields changed: read again from the start
            self._pending_reset = True


class CountingStream:
    """Any follower: position = records taken; restoring re-reads and drops that many."""

    def __init__(self, follower: Any) -> None:
        self.follower = follower
        self.count = 0
        self._drop = 0
        self.reset = False
        self._pending_reset = False

    @property
    def skipped(self) -> int:
        return int(getattr(self.follower, "skipped_lines", 0))

    def read(self) -> list[Record]:
        self.reset, self._pending_reset = self._pending_reset, False
        records = list(self.follower.read_new())
        if self._drop:
            dropped = min(self._drop, len(records))
            records, self._drop = records[dropped:], self._drop - dropped
        self.count += len(records)
        return records

    def position(self) -> dict[str, Any]:
        return {"type": "count", "count": self.count}

    def restore(self, position: dict[str, Any]) -> None:
        if position.get("type") == "count":
            self.count = self._drop = int(position.get("count", 0))
        else:
            self._pending_reset = True


def _cursor_type() -> type | None:
    """The run reader's cursor class, when the installed telescope-core has one."""
    from telescope.recording import run_reader

    found = getattr(run_reader, "StreamCursor", None)
    return found if isinstance(found, type) else None


def open_stream(reader: RunReader, name: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Stream:
    """The best :class:`Stream` for ``name`` (metrics, rollouts, events, evals) of ``reader``'s run."""
    follower = reader.follow(name)
    path = getattr(follower, "path", None)
    if isinstance(path, Path) and hasattr(follower, "offset"):
        return JsonlStream(path, max_bytes)
    if dataclasses.is_dataclass(getattr(follower, "cursor", None)) or hasattr(follower, "cursor"):
        return CursorStream(follower)
    return CountingStream(follower)
