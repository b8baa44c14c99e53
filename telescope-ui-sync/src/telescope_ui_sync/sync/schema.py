"""The DuckDB schema of the synced data, and opening the database file.

One file holds every run. Tables are long and narrow so that a new metric, event field
or eval needs no schema change:

- ``runs``: one row per run directory (or W&B run): where it is, its status, config and
  whether its directory has gone (``missing``).
- ``sync_cursors``: per run and stream, how far the syncer has read (JSON; a byte offset
  for JSON Lines files, the run reader's own cursor for block streams). Rows and their
  cursor are written in one transaction, so a restart resumes exactly where the last
  committed pass ended: nothing is read twice or skipped.
- ``metrics`` (run_id, step, time, name, value): every numeric value of metrics.jsonl;
  ``steps`` (run_id, step, time, duration): one row per step (its metrics' time and
  ``timing_step_total``), for the timeline's steps lane and the step counts.
- ``rollouts``: one row per rollout with the columns the pages filter and colour by
  (``tags``: the sample's tags as ``name=value`` or ``name`` strings),
  ``search_text`` (prompt, completion and tool output, lowercased: what search scans) and
  the whole record as JSON.
- ``events``: timeline events (kind, component, start, duration, finish, lane, step,
  sandbox, exit code) with the whole record as JSON; ``system_metrics`` holds the numeric
  fields of the ``infra.*`` samples in long form for the Infra page.
- ``event_bins``: the timeline pre-bucketed at sync, per lane and bin of start time, at
  each width of :data:`BIN_WIDTHS` (10 s, 100 s, 1,000 s): count, busy seconds, errors,
  first start, last finish and the longest event. A wide window (the whole run) is drawn
  from the widest bins that are still narrower than a pixel (a few rows per lane and
  pixel) instead of from millions of events; the lanes and the run's time range come
  from them too.
- ``evals`` (long: one row per eval metric), ``logs`` (one row per log line, with the
  level and time parsed when the line has the standard logging prefix).
- ``bad_blocks``: the sealed blocks the syncer could not read and skipped, with the error
  (see :mod:`.bad_blocks`).

Limits: DuckDB allows one writing process per file (the server's syncer); the API reads
through cursors of the same connection. Full-text search is a substring scan (``contains``) of
``search_text`` (DuckDB's ``fts`` extension is downloaded at run time, which this tool must
not do, and it matches words, not substrings): not an inverted index, but one column
read at memory speed (see the benchmark in ``bench/bench_ui_sync.py``).
"""

from __future__ import annotations

from pathlib import Path

import duckdb

SCHEMA_VERSION = 2
#: Widths of the timeline's pre-computed bins (``event_bins``), in seconds, finest first;
#: each is a multiple of the one before.
BIN_WIDTHS = (10.0, 100.0, 1000.0)

DDL = """
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY,
    name VARCHAR NOT NULL,
    path VARCHAR NOT NULL,
    root VARCHAR,
    source VARCHAR NOT NULL DEFAULT 'local',
    status VARCHAR,
    step BIGINT,
    number_of_steps BIGINT,
    start_time DOUBLE,
    end_time DOUBLE,
    updated_time DOUBLE,
    config_json VARCHAR,
    config_yaml VARCHAR,
    status_json VARCHAR,
    metadata_json VARCHAR,
    missing BOOLEAN NOT NULL DEFAULT FALSE,
    first_seen DOUBLE,
    last_sync DOUBLE,
    skipped_lines BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS sync_cursors (
    run_id VARCHAR NOT NULL,
    stream VARCHAR NOT NULL,
    cursor_json VARCHAR NOT NULL,
    PRIMARY KEY (run_id, stream)
);
CREATE TABLE IF NOT EXISTS metrics (
    run_id VARCHAR NOT NULL,
    step BIGINT NOT NULL,
    time DOUBLE,
    name VARCHAR NOT NULL,
    value DOUBLE
);
CREATE TABLE IF NOT EXISTS steps (
    run_id VARCHAR NOT NULL,
    step BIGINT NOT NULL,
    time DOUBLE,
    duration DOUBLE
);
CREATE TABLE IF NOT EXISTS rollouts (
    run_id VARCHAR NOT NULL,
    seq BIGINT NOT NULL,
    step BIGINT,
    group_index BIGINT,
    rollout_index BIGINT,
    sample_id VARCHAR,
    environment VARCHAR,
    reward DOUBLE,
    advantage DOUBLE,
    stop_reason VARCHAR,
    num_turns BIGINT,
    prompt_tokens BIGINT,
    completion_tokens BIGINT,
    total_tokens BIGINT,
    policy_version BIGINT,
    error VARCHAR,
    discard_reason VARCHAR,
    tags VARCHAR[],
    search_text VARCHAR,
    sample_metrics_json VARCHAR,
    record_json VARCHAR
);
CREATE TABLE IF NOT EXISTS events (
    run_id VARCHAR NOT NULL,
    seq BIGINT NOT NULL,
    kind VARCHAR,
    component VARCHAR,
    start DOUBLE,
    duration DOUBLE,
    finish DOUBLE,
    step BIGINT,
    lane VARCHAR,
    sandbox_id VARCHAR,
    error VARCHAR,
    exit_code BIGINT,
    record_json VARCHAR
);
CREATE TABLE IF NOT EXISTS event_bins (
    run_id VARCHAR NOT NULL,
    width DOUBLE NOT NULL,
    component VARCHAR NOT NULL,
    lane VARCHAR NOT NULL,
    bin BIGINT NOT NULL,
    events BIGINT NOT NULL,
    busy DOUBLE NOT NULL,
    errors BIGINT NOT NULL,
    first_start DOUBLE NOT NULL,
    last_finish DOUBLE NOT NULL,
    longest_seq BIGINT NOT NULL,
    longest_kind VARCHAR,
    longest_duration DOUBLE NOT NULL
);
CREATE TABLE IF NOT EXISTS system_metrics (
    run_id VARCHAR NOT NULL,
    time DOUBLE NOT NULL,
    kind VARCHAR,
    source VARCHAR,
    name VARCHAR NOT NULL,
    value DOUBLE
);
CREATE TABLE IF NOT EXISTS evals (
    run_id VARCHAR NOT NULL,
    seq BIGINT NOT NULL,
    name VARCHAR,
    step BIGINT,
    time DOUBLE,
    phase VARCHAR,
    metric VARCHAR NOT NULL,
    value DOUBLE
);
CREATE TABLE IF NOT EXISTS logs (
    run_id VARCHAR NOT NULL,
    file VARCHAR NOT NULL,
    component VARCHAR NOT NULL,
    line_no BIGINT NOT NULL,
    time DOUBLE,
    level VARCHAR,
    logger VARCHAR,
    message VARCHAR
);
CREATE TABLE IF NOT EXISTS bad_blocks (
    run_id VARCHAR NOT NULL,
    stream VARCHAR NOT NULL,
    file VARCHAR NOT NULL,
    error VARCHAR NOT NULL,
    size BIGINT,
    mtime DOUBLE,
    seen DOUBLE,
    PRIMARY KEY (run_id, stream, file)
);
"""

#: The tables whose rows belong to one run (deleted together with it).
RUN_TABLES: tuple[str, ...] = (
    "metrics",
    "steps",
    "rollouts",
    "events",
    "event_bins",
    "system_metrics",
    "evals",
    "logs",
    "sync_cursors",
    "bad_blocks",
)


def delete_run(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Remove every row of run ``run_id`` (its data, its sync positions and its ``runs`` row), in one transaction."""
    con.begin()
    try:
        for table in (*RUN_TABLES, "runs"):
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])
        con.commit()
    except BaseException:
        con.rollback()
        raise


class SchemaVersionError(RuntimeError):
    """The database file was written by a newer telescope-ui-sync."""


def connect(db_path: Path | str) -> duckdb.DuckDBPyConnection:
    """Open (creating if needed) the database file and make sure the schema is there.

    ``":memory:"`` gives a private in-memory database (tests). A database whose schema
    version is older is upgraded by dropping the synced data (it is a cache of the run
    directories and is rebuilt by the next sync); a newer one is refused.
    """
    if str(db_path) != ":memory:":
        Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(db_path))
    con.execute(DDL)
    row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
    elif int(row[0]) > SCHEMA_VERSION:
        con.close()
        raise SchemaVersionError(
            f"{db_path} was written by a newer telescope-ui-sync (schema {row[0]} > {SCHEMA_VERSION}); "
            "upgrade the package or use another --db"
        )
    elif int(row[0]) < SCHEMA_VERSION:
        for table in (*RUN_TABLES, "runs"):
            con.execute(f"DROP TABLE IF EXISTS {table}")
        con.execute(DDL)
        con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)])
    return con
