"""JSON Lines and atomic files: the low-level pieces the run store writes and reads with.

- :func:`to_jsonable` turns values into strict JSON types (numpy scalars and arrays become
  numbers and lists, paths and other objects their ``str``, NaN and inf ``null``), so every
  line is strict JSON that any reader (a browser dashboard, DuckDB) parses.
- :class:`JsonlWriter` appends whole lines to a file under a lock, flushing each batch, so a
  crash leaves at most one partial *last* line. A file reopened for appending whose last
  line is partial gets a newline first, so that line stays a lone bad line.
- :func:`parse_lines` is the reading side: it parses complete lines only (up to the last
  newline) and skips lines that are not JSON objects, counting them.
- :func:`write_atomic` replaces a file atomically (temporary file + ``os.replace``).

Limits: ``flush`` hands the data to the operating system; there is no ``fsync``, so a power
loss (not a process crash) may lose the last writes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict, is_dataclass
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from pathlib import Path
from typing import IO, Any

Record = dict[str, Any]


class RunStoreClosedError(RuntimeError):
    """A write was attempted after :meth:`RunStore.close`."""


_PLAIN_TYPES = frozenset({str, int, bool, float, type(None)})


def _all_plain(values: Iterable[Any]) -> bool:
    """Whether every value is a JSON scalar (a finite float, a string, ...), checked at C speed."""
    values = list(values)
    types = set(map(type, values))
    if not types <= _PLAIN_TYPES:
        return False
    return float not in types or all(map(math.isfinite, (v for v in values if type(v) is float)))


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON types; non-finite floats become ``None`` (strict JSON).

    A dict or list that is already plain JSON (string keys, scalar values: the common case
    of an event) is returned as it is, not copied.
    """
    kind = type(value)
    if kind is dict:
        if set(map(type, value)) <= {str} and _all_plain(value.values()):
            return value
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if kind is list and _all_plain(value):
        return value
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
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


def _not_json(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON; pass it through to_jsonable first")


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
# CPython's C encoder called directly (what json.dumps does inside, less ~1 us of Python per call)
_C_ENCODER = (
    c_make_encoder(None, _not_json, encode_basestring, None, ":", ",", False, False, False)
    if c_make_encoder is not None
    else None
)


def dumps_jsonable(value: Any) -> str:
    """Compact strict JSON for a value that is already :func:`to_jsonable`."""
    if _C_ENCODER is not None:
        return "".join(_C_ENCODER(value, 0))
    return _ENCODER.encode(value)


def dumps_line(record: Mapping[str, Any]) -> str:
    """One JSON Lines line (with the trailing newline) for ``record``."""
    return dumps_jsonable(to_jsonable(record)) + "\n"


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


def parse_lines(data: bytes) -> tuple[list[Record], int, int]:
    """The JSON objects of the complete lines of ``data``.

    Returns ``(records, consumed, skipped)``: ``consumed`` is the number of bytes up to and
    including the last newline (the rest is a line still being written, left for the next
    read); ``skipped`` counts complete lines that are not JSON objects (a partial line a
    crash left behind).
    """
    end = data.rfind(b"\n")
    if end < 0:
        return [], 0, 0
    lines = [line for line in data[:end].split(b"\n") if line.strip()]
    try:  # one parse for the lot (most reads); any bad line and the count differs or it fails
        values = json.loads(b"[" + b",".join(lines) + b"]")
        if len(values) == len(lines) and all(type(v) is dict for v in values):
            return values, end + 1, 0
    except ValueError:
        pass
    records: list[Record] = []
    skipped = 0
    for raw_line in lines:
        try:
            value = json.loads(raw_line)
        except ValueError:
            skipped += 1
            continue
        if isinstance(value, dict):
            records.append(value)
        else:
            skipped += 1
    return records, end + 1, skipped


def ends_without_newline(path: Path) -> bool:
    """Whether ``path`` is a non-empty file whose last byte is not a newline (a crash's partial line)."""
    try:
        with path.open("rb") as existing:
            existing.seek(0, os.SEEK_END)
            if existing.tell() == 0:
                return False
            existing.seek(-1, os.SEEK_END)
            return existing.read(1) != b"\n"
    except FileNotFoundError:
        return False


class AppendOnlyTextFile:
    """A text file opened for appending at the first write; thread-safe, flushed on every write.

    A file that ends in a crash's partial line gets a newline first, so the next write
    starts a line of its own. After :meth:`close`, :meth:`append` writes nothing and
    returns False.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._handle: IO[str] | None = None
        self._closed = False

    def _open(self) -> IO[str]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        needs_newline = ends_without_newline(self.path)
        handle = self.path.open("a", encoding="utf-8")
        if needs_newline:  # isolate a partial line left by a crash
            handle.write("\n")
            handle.flush()
        return handle

    def append(self, text: str) -> bool:
        """Append ``text`` whole and flush; False (nothing written) once closed."""
        with self._lock:
            if self._closed:
                return False
            if self._handle is None:
                self._handle = self._open()
            self._handle.write(text)
            self._handle.flush()
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._handle is not None:
                self._handle.close()
                self._handle = None


class JsonlWriter:
    """An append-only, thread-safe JSON Lines file: whole lines, flushed on every write."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = AppendOnlyTextFile(path)

    def write(self, record: Mapping[str, Any]) -> None:
        self.write_many([record])

    def write_many(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append records; the lines are serialised first, then written whole and flushed."""
        text = "".join(dumps_line(r) for r in records)
        if text and not self._file.append(text):
            raise RunStoreClosedError(f"cannot write to {self.path}: the run store is closed")

    def close(self) -> None:
        self._file.close()
