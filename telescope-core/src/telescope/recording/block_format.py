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
encoding (``kind``, ``component``, ``node`` repeat endlessly; blocks are 5-10x smaller than
JSON Lines), column pruning and per-row-group min/max statistics (a time or step filter
skips row groups), and a file is written once and renamed into place, which suits sealed
blocks. Arrow IPC/Feather compresses less and has no statistics; SQLite or a DuckDB file
would need a lock shared by writer and readers and can be corrupted by a killed writer;
gzip JSON Lines must be parsed whole to filter. Parquet cannot be appended to, hence the
JSON Lines tail for the open block (whole lines, readable while written).

Schema: each stream has a fixed set of typed columns (for events ``kind``, ``start``,
``duration_s``, ``component``, ``node``, ``pid``, ``step``, ``server``, ``rank``,
``sample_id``, ``group_id``, ``request_id``) plus ``extra``, a JSON object of every other
field, so the schema is the same in every block whatever fields emitters add. A value
that does not have its column's type (a string ``step``, an explicit ``null``) goes to
``extra`` under its own name, so records read back as they were written. Nested rollout
fields (``prompt``, ``messages``, ``sample_metrics``, ``policy_versions``) are ``json``
columns (JSON text) rather than Arrow structs: their shapes differ by environment (tool
calls, multi-part content, per-environment metric names), and structs would change the
schema from block to block; DuckDB's ``json_extract`` reads them where needed.

Limits: integers in ``float`` columns read back as floats (``1`` as ``1.0``); key order of
a record read from Parquet is the typed columns first, then ``extra``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa

from telescope.recording.jsonl import Record, dumps_jsonable

FORMAT_VERSION = 1
META_FILE = "_meta.json"
EXTRA_COLUMN = "extra"
_BLOCK_RE = re.compile(r"^block-(\d+)\.parquet$")
_TAIL_RE = re.compile(r"^tail-(\d+)\.jsonl$")

ColumnKind = Literal["str", "int", "float", "json"]
_ARROW_TYPES: dict[str, pa.DataType] = {
    "str": pa.string(),
    "int": pa.int64(),
    "float": pa.float64(),
    "json": pa.string(),
}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MISSING = object()


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


def _fits(value: Any, kind: ColumnKind) -> bool:
    if kind == "str":
        return type(value) is str
    if kind == "int":
        return type(value) is int and _INT64_MIN <= value <= _INT64_MAX
    if kind == "float":
        return type(value) is float or (type(value) is int and abs(value) <= 2**53)
    return True


@dataclass(frozen=True)
class Column:
    """One typed column of a stream."""

    name: str
    kind: ColumnKind


class StreamSchema:
    """Typed columns plus the ``extra`` JSON column; converts JSON-ready records to and from Arrow."""

    def __init__(self, name: str, columns: Sequence[Column]) -> None:
        self.name = name
        self.columns = tuple(columns)
        self.names = frozenset(c.name for c in self.columns)
        if EXTRA_COLUMN in self.names:
            raise ValueError(f"{EXTRA_COLUMN!r} is reserved for the fields without a column")
        fields = [pa.field(c.name, _ARROW_TYPES[c.kind]) for c in self.columns]
        self.arrow_schema = pa.schema([*fields, pa.field(EXTRA_COLUMN, pa.string())])

    def has(self, name: str) -> bool:
        return name in self.names

    def to_table(self, records: Iterable[Mapping[str, Any]]) -> pa.Table:
        """A table of ``records`` (already :func:`~telescope.recording.jsonl.to_jsonable`)."""
        columns: list[list[Any]] = [[] for _ in self.columns]
        extra: list[str | None] = []
        typed = [(i, c.name, c.kind) for i, c in enumerate(self.columns)]
        names = self.names
        for record in records:
            rest: dict[str, Any] = {}
            for i, name, kind in typed:
                value = record.get(name, _MISSING)
                if value is _MISSING:
                    columns[i].append(None)
                elif kind == "json":
                    columns[i].append(dumps_jsonable(value))
                elif value is not None and _fits(value, kind):
                    columns[i].append(float(value) if kind == "float" else value)
                else:  # null or another type: kept as is in extra
                    columns[i].append(None)
                    rest[name] = value
            for key in record.keys() - names:
                rest[key] = record[key]
            extra.append(dumps_jsonable(rest) if rest else None)
        arrays = [pa.array(values, type=_ARROW_TYPES[c.kind]) for values, c in zip(columns, self.columns, strict=True)]
        arrays.append(pa.array(extra, type=pa.string()))
        return pa.Table.from_arrays(arrays, schema=self.arrow_schema)

    def to_records(self, table: pa.Table) -> list[Record]:
        """The records of ``table`` as they were written (a missing column reads as absent)."""
        present = set(table.column_names)
        typed = [(c.name, c.kind, table.column(c.name).to_pylist()) for c in self.columns if c.name in present]
        extra = table.column(EXTRA_COLUMN).to_pylist() if EXTRA_COLUMN in present else [None] * table.num_rows
        records: list[Record] = []
        for row in range(table.num_rows):
            record: Record = {}
            for name, kind, values in typed:
                value = values[row]
                if value is None:
                    continue
                record[name] = json.loads(value) if kind == "json" else value
            rest = extra[row]
            if rest is not None:
                record.update(json.loads(rest))
            records.append(record)
        return records


def _columns(spec: str) -> list[Column]:
    out: list[Column] = []
    for item in spec.split():
        name, kind = item.split(":")
        out.append(Column(name, kind))  # type: ignore[arg-type]
    return out


#: Timeline events (:mod:`telescope.recording.events`).
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
        "step:int group_index:int rollout_index:int sample_id:str environment:str prompt:json completion:str"
        " messages:json reward:float advantage:float sample_metrics:json policy_version:int policy_versions:json"
        " stop_reason:str num_turns:int prompt_tokens:int completion_tokens:int total_tokens:int error:str"
    ),
)
