"""Bulk ingestion in DuckDB: the rows of the block streams and the metrics, without a Python loop per row.

The run store's ``rollouts/`` and ``events/`` streams come from the run reader as chunks
(:meth:`telescope.recording.run_reader.RunReader.read_chunks_since`): sealed Parquet blocks,
which DuckDB reads itself (``read_parquet``, in parallel, only the columns a query needs),
and the new lines of an open block's tail as an Arrow table of the same columns. Every
block has the stream's typed columns (``step``, ``reward``, ``kind``, ``start``, ...) and
``record``, the whole record as its JSON line; an ``INSERT ... SELECT`` takes the typed
columns as they are and the rest from ``record`` with DuckDB's JSON functions (one parse
of each record for all the paths it needs):

- rollouts: the texts searched (the prompt and the completion as text, the content of
  every message, the tool calls) are joined and lowercased once into ``search_text``, so
  a search is one ``contains`` scan of one column; ``record`` is kept whole (the sample
  view shows it).
- events: the component, the lane (the first of ``server``, ``rank``, ``sandbox_id``,
  ``worker``, ``node``, ``host``, ``lane`` that is a scalar), the sandbox and the error;
  ``finish`` (start + duration) is stored so that a time window prunes row groups on both
  ends. The numeric fields of the ``infra.*`` samples also go to ``system_metrics`` (long
  rows, one per field) for the Infra page.
- metrics (``metrics.jsonl``, one wide object per step) and the ``infra.*`` samples are
  parsed by Arrow's JSON reader (C++) and turned long column by column.

When Arrow cannot read a batch of metrics or samples (a field whose type changes from line
to line, a corrupt line), that batch goes through the Python functions of
:mod:`telescope_ui_sync.sync.records` instead, which accept anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from telescope.recording.jsonl import parse_lines
from telescope.recording.run_attempts import ATTEMPT_FIELD
from telescope_ui_sync.sync import records as rec
from telescope_ui_sync.sync.schema import BIN_WIDTHS

#: Rows in sealed blocks are numbered by file and row; tail tables carry this column.
ORDER_COLUMN = "_ord"
LANE_FIELDS = rec.LANE_FIELDS


@dataclass(frozen=True)
class Source:
    """A relation of block rows (the stream's columns, ``record`` and ``_ord``), for a FROM clause."""

    sql: str
    params: dict[str, Any]


def parquet_source(files: Sequence[tuple[Path, int]]) -> Source:
    """Sealed blocks, each from a row (the rows before it were read already), numbered
    1, 2, ... in stream order (file by file: each file's first number comes from its row
    count in the Parquet footer, so no sort is needed)."""
    values: list[str] = []
    params: dict[str, Any] = {}
    base = 0
    for i, (path, skip) in enumerate(files):
        values.append(f"($f{i}, {base - skip}, {skip})")
        params[f"f{i}"] = str(path)
        base += pq.read_metadata(path).num_rows - skip
    params["files"] = [str(path) for path, _ in files]
    sql = (
        f"(SELECT p.* EXCLUDE (filename, file_row_number), b.base + p.file_row_number + 1 AS {ORDER_COLUMN} "
        f"FROM read_parquet($files, filename = true, file_row_number = true) AS p "
        f"JOIN (VALUES {', '.join(values)}) AS b(filename, base, skip) ON p.filename = b.filename "
        f"WHERE p.file_row_number >= b.skip)"
    )
    return Source(sql, params)


def table_source(con: duckdb.DuckDBPyConnection, table: pa.Table, name: str = "_tail") -> Source:
    """New tail lines (an Arrow table of the block columns), registered on ``con`` as ``name``."""
    ordered = table.append_column(ORDER_COLUMN, pa.array(range(1, table.num_rows + 1), pa.int64()))
    con.register(name, ordered)
    return Source(name, {})


def _text(json_value: str) -> str:
    """SQL: a JSON value as text (a string as it is, anything else as its JSON; NULL for null)."""
    return (
        f"CASE json_type({json_value}) WHEN 'NULL' THEN NULL "
        f"WHEN 'VARCHAR' THEN json_extract_string({json_value}, '$') ELSE CAST({json_value} AS VARCHAR) END"
    )


def _message_text(json_value: str) -> str:
    """SQL of :func:`telescope_ui_sync.sync.records.message_text`: text, or ``role: content`` lines."""
    content = _text("json_extract(m, '$.content')")
    return (
        f"CASE json_type({json_value}) WHEN 'VARCHAR' THEN json_extract_string({json_value}, '$') WHEN 'NULL' THEN '' "
        f"WHEN 'ARRAY' THEN array_to_string(list_transform(TRY_CAST({json_value} AS JSON[]), "
        f"lambda m: CASE json_type(m) WHEN 'OBJECT' THEN coalesce(json_extract_string(m, '$.role'), '?') || ': ' "
        f"|| coalesce({content}, '') "
        f"ELSE {_text('m')} END), chr(10)) "
        f"ELSE coalesce(CAST({json_value} AS VARCHAR), '') END"
    )


#: SQL: a rollout's ``tags`` (``{tags}``: its JSON) as strings: ``name=value`` for each entry
#: of an object, each item of a list (NULL when it has none).
TAGS = (
    "CASE json_type({tags}) "
    "WHEN 'OBJECT' THEN list_transform(map_entries(TRY_CAST({tags} AS MAP(VARCHAR, JSON))), "
    "lambda e: e.key || '=' || coalesce(json_extract_string(e.value, '$'), 'null')) "
    "WHEN 'ARRAY' THEN list_transform(TRY_CAST({tags} AS JSON[]), "
    "lambda v: coalesce(json_extract_string(v, '$'), 'null')) "
    "END"
)
ROLLOUT_PATHS = ["$.prompt", "$.completion", "$.sample_metrics", "$.discard_reason", "$.discarded", "$.tags"]
#: SQL: the texts search finds, lowercased: the prompt, the completion, the content of every
#: message (tool and environment output among them) and the tool calls. Duplicates (the
#: prompt is usually the first message too) are kept once; the order does not matter to a
#: substring search.
SEARCH_TEXT = (
    "lower(array_to_string(list_distinct(flatten(["
    "[{prompt}, {completion}], coalesce(json_extract_string(record, '$.messages[*].content'), []), "
    "CASE WHEN contains(record, '\"tool_calls\"') "
    "THEN [CAST(json_extract(record, '$.messages[*].tool_calls') AS VARCHAR)] ELSE [] END])), chr(10)))"
)


def insert_rollouts(con: duckdb.DuckDBPyConnection, run_id: str, source: Source, first_seq: int) -> int:
    """Rows of ``rollouts`` for every row of ``source``, numbered from ``first_seq`` in stream order."""
    prompt, completion, sample_metrics, discard, discarded, tags = (f"j[{i}]" for i in range(1, len(ROLLOUT_PATHS) + 1))
    search_text = SEARCH_TEXT.format(prompt=_message_text(prompt), completion=_message_text(completion))
    sql = f"""
        INSERT INTO rollouts (run_id, seq, step, group_index, rollout_index, sample_id, environment, reward, advantage,
            stop_reason, num_turns, prompt_tokens, completion_tokens, total_tokens, policy_version, error,
            discard_reason, tags, search_text, sample_metrics_json, record_json)
        SELECT $run, $first + {ORDER_COLUMN} - 1, step, group_index, rollout_index, sample_id, environment, reward,
            advantage, stop_reason, num_turns, prompt_tokens, completion_tokens, total_tokens, policy_version, error,
            coalesce({_text(discard)}, CASE WHEN CAST({discarded} AS VARCHAR) = 'true' THEN 'discarded' END),
            {TAGS.format(tags=tags)}, {search_text},
            CASE json_type({sample_metrics}) WHEN 'OBJECT' THEN CAST({sample_metrics} AS VARCHAR) ELSE '{{}}' END,
            record
        FROM (SELECT *, json_extract(record, $paths) AS j FROM {source.sql})
    """
    params = {**source.params, "run": run_id, "first": first_seq, "paths": ROLLOUT_PATHS}
    (count,) = con.execute(sql, params).fetchone() or (0,)
    return int(count)


LANE_PATHS = [f"$.{field}" for field in LANE_FIELDS]


def _field(name: str) -> str:
    """SQL: an untyped top-level field of ``record`` as text, parsed only when the record names it."""
    value = _text(f"json_extract(record, '$.{name}')")
    return f"CASE WHEN contains(record, '\"{name}\"') THEN {value} END"


#: SQL: the lane fields of a record that the typed ``server`` and ``rank`` columns do not
#: settle (most events have one), as a JSON list; NULL when they do.
LANE_JSON = (
    "CASE WHEN server IS NULL AND (rank IS NULL OR contains(record, '\"server\"')) "
    f"THEN json_extract(record, {LANE_PATHS!r}) END"
)


def _lane() -> str:
    """SQL of the lane rule of :data:`LANE_FIELDS` over a relation with ``lane_json``
    (:data:`LANE_JSON`): the first lane field that is a scalar, ``'<field> <value>'``, else ``'main'``."""
    cases = " ".join(
        f"WHEN json_type(lane_json[{i}]) NOT IN ('NULL', 'OBJECT', 'ARRAY') "
        f"THEN '{field} ' || json_extract_string(lane_json[{i}], '$')"
        for i, field in enumerate(LANE_FIELDS, start=1)
    )
    return (
        "CASE WHEN lane_json IS NULL AND server IS NOT NULL THEN 'server ' || server "
        f"WHEN lane_json IS NULL THEN 'rank ' || rank {cases} ELSE 'main' END"
    )


def insert_events(con: duckdb.DuckDBPyConnection, run_id: str, source: Source, first_seq: int) -> int:
    """Rows of ``events`` and of ``system_metrics`` (the numeric fields of ``infra.*``
    samples) for the rows of ``source``, numbered from ``first_seq`` in stream order;
    returns the number of records read."""
    kind = f"coalesce(kind, {_field('kind')})"
    rows = f"(SELECT *, {LANE_JSON} AS lane_json FROM {source.sql})"
    (records,) = con.execute(
        f"""
        INSERT INTO events (run_id, seq, kind, component, start, duration, finish, step, lane, sandbox_id, error,
            exit_code, record_json)
        SELECT $run, $first + {ORDER_COLUMN} - 1, {kind},
            CASE WHEN component <> '' THEN component ELSE split_part(coalesce({kind}, 'other'), '.', 1) END,
            start, coalesce(duration_s, 0.0), start + coalesce(duration_s, 0.0), step, {_lane()},
            {_field("sandbox_id")}, {_field("error")}, TRY_CAST({_field("exit_code")} AS BIGINT), record
        FROM {rows}
        """,
        {**source.params, "run": run_id, "first": first_seq},
    ).fetchone() or (0,)
    _add_bins(con, run_id, first_seq, int(records))
    infra = con.sql(
        f"SELECT kind, start, {_lane()} AS lane, record FROM {rows} "
        f"WHERE starts_with(kind, 'infra.') AND start IS NOT NULL ORDER BY {ORDER_COLUMN}",
        params=source.params or None,
    ).to_arrow_table()
    append(con, "system_metrics", infra_long(run_id, infra))
    return int(records)


BIN_KEY = "run_id, width, component, lane, bin"
BIN_COLUMNS = f"{BIN_KEY}, events, busy, errors, first_start, last_finish, longest_seq, longest_kind, longest_duration"
#: SQL: the bins of ``{rows}`` (rows of ``event_bins``, with ``bin`` counted in widths of
#: ``$fine`` seconds) added up into bins ``$width`` seconds wide.
MERGE_BINS = (
    "SELECT run_id, $width AS width, component, lane, CAST(floor(bin * $fine / $width) AS BIGINT) AS bin, "
    "sum(events) AS events, sum(busy) AS busy, sum(errors) AS errors, min(first_start) AS first_start, "
    "max(last_finish) AS last_finish, arg_max(longest_seq, longest_duration) AS longest_seq, "
    "arg_max(longest_kind, longest_duration) AS longest_kind, max(longest_duration) AS longest_duration "
    "FROM ({rows}) GROUP BY ALL"
)


def _add_bins(con: duckdb.DuckDBPyConnection, run_id: str, first_seq: int, count: int) -> None:
    """Add the timeline events numbered ``first_seq`` .. ``first_seq + count - 1`` to ``event_bins``,
    at every width of :data:`BIN_WIDTHS` (the wider ones added up from the finest).

    A bin that already has events (the batch before ended inside it) is merged with the new
    ones: its row is read, deleted and written again added up. (A primary key and ``ON
    CONFLICT`` would do the same but cost more than the grouping itself to maintain.)
    """
    fine = BIN_WIDTHS[0]
    con.execute(
        """
        CREATE OR REPLACE TEMP TABLE _new_bins AS
        SELECT run_id, $fine AS width, component, lane, CAST(floor(start / $fine) AS BIGINT) AS bin,
            count(*) AS events, sum(duration) AS busy, count(error) AS errors, min(start) AS first_start,
            max(finish) AS last_finish, arg_max(seq, duration) AS longest_seq, arg_max(kind, duration) AS longest_kind,
            max(duration) AS longest_duration
        FROM events
        WHERE run_id = $run AND seq >= $first AND seq < $first + $count AND start IS NOT NULL
            AND NOT starts_with(coalesce(kind, ''), 'infra.')
        GROUP BY ALL
        """,
        {"run": run_id, "first": first_seq, "count": count, "fine": fine},
    )
    try:
        for width in BIN_WIDTHS:
            new = "_new_bins" if width == fine else f"({MERGE_BINS.format(rows='SELECT * FROM _new_bins')})"
            params = {"width": width, "fine": fine} if width != fine else {}
            con.execute(f"CREATE OR REPLACE TEMP TABLE _bins AS SELECT {BIN_COLUMNS} FROM {new}", params)
            con.execute(
                f"""
                CREATE OR REPLACE TEMP TABLE _old_bins AS
                SELECT {BIN_COLUMNS} FROM event_bins
                WHERE run_id = $run AND width = $width AND bin >= (SELECT min(bin) FROM _bins)
                    AND ({BIN_KEY}) IN (SELECT ({BIN_KEY}) FROM _bins)
                """,
                {"run": run_id, "width": width},
            )
            con.execute(
                f"DELETE FROM event_bins WHERE run_id = $run AND width = $width "
                f"AND bin >= (SELECT min(bin) FROM _old_bins) AND ({BIN_KEY}) IN (SELECT ({BIN_KEY}) FROM _old_bins)",
                {"run": run_id, "width": width},
            )
            rows = "SELECT * FROM _bins UNION ALL SELECT * FROM _old_bins"
            con.execute(
                f"INSERT INTO event_bins ({BIN_COLUMNS}) {MERGE_BINS.format(rows=rows)}",
                {"width": width, "fine": width},
            )
    finally:
        for table in ("_new_bins", "_bins", "_old_bins"):
            con.execute(f"DROP TABLE IF EXISTS {table}")


def replace_steps(con: duckdb.DuckDBPyConnection, run_id: str, rows: pa.Table) -> None:
    """Write ``metrics`` rows (from :func:`metrics_long`) and their ``steps`` rows; a step written
    again (a resumed run) replaces what it had."""
    if rows.num_rows == 0:
        return
    con.register("_metrics", rows)
    try:
        for table in ("metrics", "steps"):
            con.execute(
                f"DELETE FROM {table} WHERE run_id = $run AND step IN (SELECT DISTINCT step FROM _metrics)",
                {"run": run_id},
            )
        con.execute("INSERT INTO metrics SELECT * FROM _metrics")
        con.execute(
            "INSERT INTO steps SELECT run_id, step, any_value(time) FILTER (WHERE time IS NOT NULL), "
            "max(value) FILTER (WHERE name = 'timing_step_total') FROM _metrics GROUP BY run_id, step"
        )
    finally:
        con.unregister("_metrics")


def append(con: duckdb.DuckDBPyConnection, table: str, rows: pa.Table) -> None:
    """Insert an Arrow table whose columns are in the table's order."""
    if rows.num_rows == 0:
        return
    con.register("_batch", rows)
    try:
        con.execute(f"INSERT INTO {table} SELECT * FROM _batch")
    finally:
        con.unregister("_batch")


# ------------------------------------------------------------------ wide JSON -> long rows


def _read_lines(lines: pa.Array) -> pa.Table:
    """JSON lines (a string array) as a table, one column per key (Arrow infers the types)."""
    joined = "\n".join(lines.to_pylist()).encode("utf-8") + b"\n"
    return pa_json.read_json(pa.BufferReader(joined), pa_json.ReadOptions(block_size=max(len(joined), 1 << 20)))


def _numeric(column: pa.ChunkedArray, with_bool: bool) -> pa.ChunkedArray | None:
    kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or (with_bool and pa.types.is_boolean(kind)):
        return column.cast(pa.float64())
    return None


def _long(wide: pa.Table, keys: dict[str, pa.Array], skip: frozenset[str], with_bool: bool) -> dict[str, pa.Array]:
    """Long columns (``keys`` repeated, ``name``, ``value``) of the finite numeric columns of ``wide``."""
    parts: dict[str, list[pa.Array]] = {name: [] for name in (*keys, "name", "value")}
    for name, column in zip(wide.column_names, wide.columns, strict=True):
        if name in skip:
            continue
        values = _numeric(column, with_bool)
        if values is None:
            continue
        values = values.combine_chunks()
        keep = pc.and_(pc.is_valid(values), pc.is_finite(pc.fill_null(values, 0.0)))
        count = pc.sum(keep).as_py() or 0
        if not count:
            continue
        for key, array in keys.items():
            parts[key].append(array.filter(keep))
        parts["name"].append(pa.array([name] * count, pa.string()))
        parts["value"].append(values.filter(keep))
    return {name: pa.concat_arrays(arrays) if arrays else pa.array([], pa.float64()) for name, arrays in parts.items()}


def metrics_long(run_id: str, lines: list[bytes]) -> tuple[pa.Table, int, int]:
    """(``metrics`` rows, steps read, bad lines) of ``metrics.jsonl`` lines; the last record of a step wins.

    Arrow parses the lines; a batch it cannot read goes through
    :func:`telescope_ui_sync.sync.records.metrics_columns` (which also skips bad lines).
    """
    try:
        data = b"\n".join(lines) + b"\n"
        wide = pa_json.read_json(pa.BufferReader(data), pa_json.ReadOptions(block_size=max(len(data), 1 << 20)))
        if wide.num_rows != len(lines) or "step" not in wide.column_names:
            raise ValueError("not one object per line with a step")
        step = wide.column("step")
        if not pa.types.is_integer(step.type):
            raise ValueError("a step that is not an integer")
    except (pa.ArrowException, ValueError):
        return _metrics_in_python(run_id, lines)
    step = step.combine_chunks().cast(pa.int64())
    last = _last_of_each(step)
    wide = wide.filter(last)
    step = step.filter(last)
    time = _numeric(wide.column("time"), False) if "time" in wide.column_names else None
    time_array = time.combine_chunks() if time is not None else pa.nulls(wide.num_rows, pa.float64())
    long = _long(wide, {"step": step, "time": time_array}, frozenset({"step", "time", ATTEMPT_FIELD}), with_bool=True)
    rows = pa.table(
        {
            "run_id": pa.array([run_id] * len(long["name"]), pa.string()),
            "step": long["step"].cast(pa.int64()),
            "time": long["time"].cast(pa.float64()),
            "name": long["name"],
            "value": long["value"],
        }
    )
    return rows, int(pc.sum(last).as_py() or 0), 0


def _last_of_each(step: pa.Array) -> pa.Array:
    """A mask of the rows that are the last of their step (and have one)."""
    values = step.to_pylist()
    last: dict[int, int] = {}
    for index, value in enumerate(values):
        if value is not None:
            last[value] = index
    keep = [False] * len(values)
    for index in last.values():
        keep[index] = True
    return pa.array(keep, pa.bool_())


def _metrics_in_python(run_id: str, lines: list[bytes]) -> tuple[pa.Table, int, int]:
    records, _, bad = parse_lines(b"\n".join(lines) + b"\n")
    latest = {record.get("step"): record for record in records}  # a resumed run may write a step again: the last wins
    table = rec.metrics_columns(run_id, latest.values())
    return table, len([step for step in latest if rec._integer(step) is not None]), bad


INFRA_SKIP = rec.EVENT_COLUMNS | frozenset(LANE_FIELDS)


def infra_long(run_id: str, infra: pa.Table) -> pa.Table:
    """``system_metrics`` rows: one per numeric (not boolean) field of each ``infra.*`` sample."""
    if infra.num_rows == 0:
        return rec.system_metrics_table(run_id, [], [], [], [], [])
    try:
        wide = _read_lines(infra.column("record").combine_chunks())
        if wide.num_rows != infra.num_rows:
            raise ValueError("not one object per line")
    except (pa.ArrowException, ValueError):
        return _infra_in_python(run_id, infra)
    keys = {name: infra.column(name).combine_chunks() for name in ("start", "kind", "lane")}
    long = _long(wide, keys, INFRA_SKIP, with_bool=False)
    return pa.table(
        {
            "run_id": pa.array([run_id] * len(long["name"]), pa.string()),
            "time": long["start"].cast(pa.float64()),
            "kind": long["kind"].cast(pa.string()),
            "source": long["lane"].cast(pa.string()),
            "name": long["name"],
            "value": long["value"],
        }
    )


def _infra_in_python(run_id: str, infra: pa.Table) -> pa.Table:
    columns: dict[str, list[Any]] = {k: [] for k in ("time", "kind", "source", "name", "value")}
    for kind, start, lane, line in zip(
        *(infra.column(c).to_pylist() for c in ("kind", "start", "lane", "record")), strict=True
    ):
        for name, value in rec.infra_values(json.loads(line)):
            for key, item in zip(columns, (start, kind, lane, name, value), strict=True):
                columns[key].append(item)
    return rec.system_metrics_table(run_id, *columns.values())


#: SQL: the attempt that wrote a ``rollouts`` row (0 for a record written before attempts existed).
_ROW_ATTEMPT = f"coalesce(TRY_CAST(json_extract(record_json, '$.{ATTEMPT_FIELD}') AS BIGINT), 0)"


def drop_abandoned_rollouts(
    con: duckdb.DuckDBPyConnection, run_id: str, superseded: Mapping[int, int], from_seq: int = 0
) -> None:
    """Delete the run's ``rollouts`` rows (from ``from_seq`` on) that a later attempt abandoned.

    ``superseded``: per attempt, the first step of its abandoned rows
    (:func:`telescope.recording.run_attempts.superseded_from`).
    """
    if not superseded:
        return
    abandoned = " OR ".join(f"({_ROW_ATTEMPT} = {int(a)} AND step >= {int(k)})" for a, k in superseded.items())
    con.execute(
        f"DELETE FROM rollouts WHERE run_id = $run AND seq >= $from AND ({abandoned})",
        {"run": run_id, "from": from_seq},
    )
