"""The on-disk format of the run store's block streams: ``events/`` and ``rollouts/``.

A stream is a directory of numbered blocks. Block ``N`` is, while it is open, a JSON Lines
*tail* ``tail-<N>.jsonl`` (appended in batches by the writer thread; for events also an
index ``tail-<N>.idx`` of one ``<flush time> <bytes> <rows>`` line per flush, for cheap
time-window reads) and, once sealed, one Parquet file ``block-<N>.parquet`` holding the
same records in the same order. Block numbers are consecutive from 0; a directory has at
most one tail (the open block), except a crashed run's, whose orphan tail the next writer
seals. ``_meta.json`` holds the stream's settings (block length, flush interval, tail window).

Why Parquet for sealed blocks: the volume (millions of events, rollouts of kilobytes each)
calls for a columnar, compressed, immutable format that the dashboard's DuckDB and pyarrow,
pandas or polars read directly. Parquet gives per-column zstd compression with dictionary
encoding (``kind``, ``component``, ``node`` repeat endlessly; blocks are 6-13x smaller than
JSON Lines), column pruning and per-row-group min/max statistics (a time or step filter
skips row groups), and a file is written once and renamed into place, which suits sealed
blocks. Arrow IPC/Feather compresses less and has no statistics; SQLite or a DuckDB file
would need a lock shared by writer and readers and can be corrupted by a killed writer;
gzip JSON Lines must be parsed whole to filter. Parquet cannot be appended to, hence the
JSON Lines tail for the open block (whole lines, readable while written).

Schema: each stream has a fixed set of typed columns (for events ``kind``, ``start``,
``duration_s``, ``component``, ``node``, ``pid``, ``step``, ``server``, ``rank``,
``sample_id``, ``group_id``, ``request_id``; for rollouts the scalar fields of
:func:`~telescope.recording.run_store.rollout_record`) and ``record``, the whole record as
the JSON line the tail held, so the schema is the same in every block whatever fields
emitters add. The typed columns are for filtering and queries (DuckDB, Arrow filters with
row-group statistics); a value without its column's type (a string ``step``) is a null
there. ``record`` gives records back exactly as written (key order, ints, nested values).
Nested rollout fields (``prompt``, ``messages``, ``sample_metrics``) stay JSON inside
``record`` rather than Arrow structs: their shapes differ by environment (tool calls,
multi-part content, per-environment metric names), so structs would change the schema from
block to block; DuckDB's ``json_extract`` reads them where needed.

Why the whole line rather than only the untyped fields: a sealed block is made from its
tail by Arrow's JSON reader and line splitter, in C++ and without the GIL (see
:meth:`StreamSchema.table_from_lines`), so the writer thread's Python work is one JSON
encoding per record, which the tail needs anyway. Splitting each record into typed values
and an ``extra`` object in Python cost three times that and held the GIL, which slowed
the training loop's thread. The price is size: the typed values are stored twice, and
zstd gets events 13x smaller than JSON Lines instead of 23x (rollouts 6x either way:
``messages`` repeats the prompt and completion, which zstd finds in the same column).

Limits: a block's records are parsed in one piece when read (a list of dicts).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from telescope.recording.jsonl import Record

FORMAT_VERSION = 1
META_FILE = "_meta.json"
RECORD_COLUMN = "record"
_BLOCK_RE = re.compile(r"^block-(\d+)\.parquet$")
_TAIL_RE = re.compile(r"^tail-(\d+)\.jsonl$")

ColumnKind = Literal["str", "int", "float"]
_ARROW_TYPES: dict[str, pa.DataType] = {"str": pa.string(), "int": pa.int64(), "float": pa.float64()}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: Bytes of a tail converted at a time when a block is sealed (bounds the memory it takes).
SEAL_CHUNK_BYTES = 32 * 1024 * 1024


def block_path(directory: Path, seq: int) -> Path:
    """The sealed (Parquet) file of block ``seq``."""
    return directory / f"block-{seq:06d}.parquet"


def tail_path(directory: Path, seq: int) -> Path:
    """The JSON Lines tail of block ``seq`` while it is open."""
    return directory / f"tail-{seq:06d}.jsonl"


def index_path(directory: Path, seq: int) -> Path:
    """The flush index of the tail of block ``seq``: ``<flush time> <bytes> <rows>`` per line."""
    return directory / f"tail-{seq:06d}.idx"


@dataclass
class Listing:
    """The blocks of a stream directory at one moment: sealed and open block numbers."""

    sealed: set[int] = field(default_factory=set)
    tails: set[int] = field(default_factory=set)

    @property
    def seqs(self) -> list[int]:
        return sorted(self.sealed | self.tails)


def list_blocks(directory: Path) -> Listing:
    """Scan ``directory`` (a missing directory is an empty stream); temporary files are ignored."""
    listing = Listing()
    try:
        names = [entry.name for entry in _scandir(directory)]
    except FileNotFoundError:
        return listing
    for name in names:
        if match := _BLOCK_RE.match(name):
            listing.sealed.add(int(match.group(1)))
        elif match := _TAIL_RE.match(name):
            listing.tails.add(int(match.group(1)))
    return listing


def _scandir(directory: Path) -> list[os.DirEntry[str]]:
    with os.scandir(directory) as entries:
        return list(entries)


def _fits_str(value: Any) -> bool:
    return type(value) is str


def _fits_int(value: Any) -> bool:
    return type(value) is int and _INT64_MIN <= value <= _INT64_MAX


def _fits_float(value: Any) -> bool:
    return type(value) is float or (type(value) is int and _INT64_MIN <= value <= _INT64_MAX)


_FITS = {"str": _fits_str, "int": _fits_int, "float": _fits_float}


@dataclass(frozen=True)
class Column:
    """One typed column of a stream."""

    name: str
    kind: ColumnKind


class StreamSchema:
    """Typed columns plus ``record``, the whole record as its JSON line."""

    def __init__(self, name: str, columns: Sequence[Column]) -> None:
        self.name = name
        self.columns = tuple(columns)
        if RECORD_COLUMN in {c.name for c in self.columns}:
            raise ValueError(f"{RECORD_COLUMN!r} is the column of the whole record")
        fields = [pa.field(c.name, _ARROW_TYPES[c.kind]) for c in self.columns]
        self.typed_schema = pa.schema(fields)
        self.arrow_schema = pa.schema([*fields, pa.field(RECORD_COLUMN, pa.string())])
        self._parse_options = pa_json.ParseOptions(
            explicit_schema=self.typed_schema, unexpected_field_behavior="ignore"
        )

    def table_from_lines(self, data: bytes) -> pa.Table:
        """The table of ``data``, complete JSON lines (each ending in a newline).

        Arrow parses the typed columns and splits the lines in C++, without the GIL, so
        sealing a block barely slows the Python threads of the run. When that fails (a
        value of another type than its column's, a line a crash cut short) the lines are
        parsed one by one: bad lines are left out and misfit values become nulls (the
        ``record`` column keeps them).
        """
        lines = pc.split_pattern(pa.array([data], pa.binary()), b"\n").flatten()
        lines = lines.slice(0, len(lines) - 1)  # after the last newline: nothing
        try:
            read_options = pa_json.ReadOptions(block_size=max(len(data), 1 << 20))
            typed = pa_json.read_json(pa.BufferReader(data), read_options, self._parse_options)
            if typed.num_rows == len(lines):
                records = lines.cast(pa.string())
                return pa.Table.from_arrays([*typed.columns, records], schema=self.arrow_schema)
        except (pa.ArrowException, ValueError):
            pass
        return self._table_line_by_line(data)

    def _table_line_by_line(self, data: bytes) -> pa.Table:
        records: list[Mapping[str, Any]] = []
        kept: list[str] = []
        for raw_line in data.splitlines():
            try:
                value = json.loads(raw_line)
            except ValueError:
                continue
            if isinstance(value, dict):
                records.append(value)
                kept.append(raw_line.decode("utf-8"))
        arrays = []
        for column in self.columns:
            fits = _FITS[column.kind]
            values = [r.get(column.name) for r in records]
            arrays.append(pa.array([v if fits(v) else None for v in values], type=_ARROW_TYPES[column.kind]))
        arrays.append(pa.array(kept, type=pa.string()))
        return pa.Table.from_arrays(arrays, schema=self.arrow_schema)

    def to_records(self, table: pa.Table) -> list[Record]:
        """The records of ``table`` exactly as they were written (their ``record`` column)."""
        lines = table.column(RECORD_COLUMN).to_pylist()
        if not lines:
            return []
        records: list[Record] = json.loads("[" + ",".join(lines) + "]")  # one parse for the lot
        return records


def _columns(spec: str) -> list[Column]:
    out: list[Column] = []
    for item in spec.split():
        name, kind = item.split(":")
        out.append(Column(name, kind))  # type: ignore[arg-type]
    return out


#: Timeline events (:mod:`telescope.api.events`).
EVENTS_SCHEMA = StreamSchema(
    "events",
    _columns(
        "kind:str start:float duration_s:float component:str node:str pid:int step:int server:int rank:int"
        " sample_id:str group_id:int request_id:str"
    ),
)

#: Rollout records (:func:`telescope.recording.run_store.rollout_record`).
ROLLOUTS_SCHEMA = StreamSchema(
    "rollouts",
    _columns(
        "step:int group_index:int rollout_index:int sample_id:str environment:str reward:float advantage:float"
        " policy_version:int stop_reason:str num_turns:int prompt_tokens:int completion_tokens:int total_tokens:int"
        " error:str"
    ),
)
