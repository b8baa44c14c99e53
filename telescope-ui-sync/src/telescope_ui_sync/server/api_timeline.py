"""Timeline, event, sandbox and infra routes.

The timeline is served by time window: lanes are (component, lane) pairs (a server, a
rank, a sandbox, ...; see :mod:`telescope_ui_sync.sync.ingest`), plus a "trainer / steps"
lane built from the step metrics (each step ends at its metrics' time and lasts
``timing_step_total``), so a run that records no events still has a timeline. A window
with more than ``limit`` events returns the ``limit`` longest ones, says ``truncated``
and adds ``bins``: per lane, the window cut into ``buckets`` (about one per pixel) with
the events, busy time, errors and longest event of each, drawn as a density under the
longest events (zooming in shows the rest). The whole run's bins come from the
``event_bins`` table that the syncer fills (pre-bucketed), not from the events, so the
whole timeline costs about the same for ten thousand events or ten million; a narrow
window reads only the row groups of its time (``start`` and ``finish`` are columns, so
their min/max statistics prune both ends). The lanes and the run's time range come from
``event_bins`` too. Responses are encoded with ``json.dumps`` directly (see
:func:`telescope_ui_sync.server.deps.fast_json`).

Browser episodes: the ``browser.*`` events of every episode (``session_id``, one per
episode) share one lane, ``browser · main``, in which each session gets a row of its own
(the front end gives a row to each session's span, so the actions of one episode read left
to right on one row, and a row is reused once its episode has ended). A lane per session
was the other way: it would add 64 lanes at a time (22 px each: 1,400 px of timeline for
one step of 64 episodes) and thousands over a run, most of them empty in any window; one
lane of rows takes 6 px a concurrent episode, as the 64 concurrent requests of one
inference server do. For that, each drawn event of a component of :data:`ROW_GROUP_FIELDS`
comes with its ``group`` (the session), read from the records of the drawn events only (a
second, small query), so the lane and bin tables stay as they are. Limits: the rows are
laid out per window (a zoom may move a session to another row), a session is placed by
its events in the window (a truncated window's longest events only), and a lane draws at
most 64 rows (more concurrent sessions share the last).
"""

from __future__ import annotations

import json
from typing import Any

import duckdb
from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import Response

from telescope_ui_sync.server.deps import cursor, fast_json, run_row
from telescope_ui_sync.sync.records import EVENT_COLUMNS
from telescope_ui_sync.sync.schema import BIN_WIDTHS

router = APIRouter(prefix="/api")

COMPONENT_ORDER = (
    "trainer",
    "orchestrator",
    "inference",
    "sandbox",
    "browser",
    "tool",
    "reward",
    "weights",
    "system",
)
#: Per component, the event field whose value keeps events on one row of their lane (see the module docstring).
ROW_GROUP_FIELDS = {"browser": "session_id"}
STEPS_LANE = {"id": "trainer|steps", "component": "trainer", "lane": "steps"}
TIMELINE = "run_id = $run AND NOT starts_with(coalesce(kind, ''), 'infra.')"


def _component_rank(component: str) -> tuple[int, str]:
    return (COMPONENT_ORDER.index(component) if component in COMPONENT_ORDER else len(COMPONENT_ORDER), component)


def _steps(cur: duckdb.DuckDBPyConnection, run: str) -> list[dict[str, Any]]:
    rows = cur.execute(
        "SELECT step, time, duration FROM steps WHERE run_id = ? AND time IS NOT NULL ORDER BY step", [run]
    ).fetchall()
    steps = []
    previous_end: float | None = None
    for step, end, duration in rows:
        start = end - duration if duration is not None else previous_end if previous_end is not None else end
        steps.append({"step": step, "start": start, "end": end})
        previous_end = end
    return steps


def _bins(
    cur: duckdb.DuckDBPyConnection, run: str, start: float, end: float, buckets: int, lanes: list[str]
) -> dict[str, Any]:
    """Per lane, the window cut into ``buckets``: events, busy seconds, errors and the longest
    event of each bucket that has any (by start time). From the pre-computed ``event_bins``
    (the widest that fit in a bucket) when a bucket is 10 s or wider, else from the window's events.

    Columns of equal length, compact: ``lane`` indexes ``lanes``, ``bucket`` counts
    ``width`` seconds from ``origin``, ``kind`` (of the longest event) indexes ``kinds``.
    """
    width = (end - start) / buckets
    binned = max((w for w in BIN_WIDTHS if w <= width), default=None)  # the widest bins narrower than a bucket
    if binned is not None:
        source = (
            "SELECT component, lane, first_start AS t, events AS n, busy, errors, longest_seq AS seq, "
            "longest_kind AS kind, longest_duration AS duration FROM event_bins "
            "WHERE run_id = $run AND width = $bin AND bin >= floor($start / $bin) AND bin <= floor($end / $bin)"
        )
    else:
        source = (
            "SELECT component, lane, start AS t, 1 AS n, duration AS busy, CAST(error IS NOT NULL AS BIGINT) AS errors,"
            f" seq, kind, duration FROM events WHERE {TIMELINE} AND start >= $start AND start <= $end"
        )
    rows = cur.execute(
        f"""
        SELECT component || '|' || lane, CAST(least(greatest(floor((t - $start) / $width), 0), $buckets - 1) AS BIGINT),
            sum(n), sum(busy), sum(errors), arg_max(seq, duration), arg_max(kind, duration)
        FROM ({source}) GROUP BY ALL ORDER BY 1, 2
        """,
        {"run": run, "start": start, "end": end, "width": width, "buckets": buckets}
        | ({"bin": binned} if binned is not None else {}),
    ).fetchall()
    lane_index = {lane: i for i, lane in enumerate(lanes)}
    kinds: dict[str | None, int] = {}
    columns: dict[str, list[Any]] = {k: [] for k in ("lane", "bucket", "count", "busy", "errors", "seq", "kind")}
    for lane, bucket, count, busy, errors, seq, kind in rows:
        for key, value in zip(
            columns,
            (lane_index.get(lane, -1), bucket, count, round(busy, 6), errors, seq, kinds.setdefault(kind, len(kinds))),
            strict=True,
        ):
            columns[key].append(value)
    return {"origin": start, "width": width, "kinds": list(kinds), **columns}


def _groups(cur: duckdb.DuckDBPyConnection, run: str, rows: list[Any]) -> dict[int, str]:
    """The row group (:data:`ROW_GROUP_FIELDS`: a browser event's session) of each drawn event that has one, by seq.

    Read from the records of those events only (a semi-join on their seqs, the seq range
    pruning row groups: about 15 ms for 2,000 drawn events among a million): ``rows`` are
    the drawn events (at most ``limit``), as the timeline query returns them (seq first,
    component third).
    """
    found: dict[int, str] = {}
    for component, field in ROW_GROUP_FIELDS.items():
        seqs = [row[0] for row in rows if row[2] == component]
        if not seqs:
            continue
        pairs = cur.execute(
            "SELECT seq, json_extract_string(record_json, $path) FROM events "
            "WHERE run_id = $run AND seq BETWEEN $lo AND $hi AND seq IN (SELECT unnest($seqs))",
            {"run": run, "path": f"$.{field}", "lo": min(seqs), "hi": max(seqs), "seqs": seqs},
        ).fetchall()
        found.update((seq, group) for seq, group in pairs if group is not None)
    return found


@router.get("/timeline")
def timeline(
    run: str,
    start: float | None = None,
    end: float | None = None,
    limit: int = Query(2000, ge=1, le=200000),
    buckets: int = Query(300, ge=1, le=10000),
    cur: duckdb.DuckDBPyConnection = Depends(cursor),
) -> Response:
    """Lanes and events overlapping [start, end] (the whole run when omitted).

    A window holding at most ``limit`` events returns them all. A fuller one returns its
    ``limit`` longest events and, per lane, ``bins``: the window cut into ``buckets``
    with each bucket's events, busy seconds, errors and longest event (``truncated``; see
    :func:`_bins` for the columns).
    """
    run_row(cur, run)
    lo, hi = cur.execute(
        "SELECT min(first_start), max(last_finish) FROM event_bins WHERE run_id = ? AND width = ?",
        [run, BIN_WIDTHS[-1]],
    ).fetchone() or (None, None)
    steps = _steps(cur, run)
    if steps:
        lo = min(x for x in (lo, steps[0]["start"]) if x is not None)
        hi = max(x for x in (hi, steps[-1]["end"]) if x is not None)
    window_start = start if start is not None else lo
    window_end = end if end is not None else hi
    if window_start is None or window_end is None:
        return fast_json(
            {
                "range": None,
                "window": None,
                "lanes": [],
                "events": [],
                "bins": None,
                "steps": [],
                "truncated": False,
                "total": 0,
            }
        )
    where = f"{TIMELINE} AND start <= $end AND finish >= $start"
    params = {"run": run, "start": window_start, "end": window_end}
    (count,) = cur.execute(f"SELECT count(*) FROM events WHERE {where}", params).fetchone() or (0,)
    order = "start" if count <= limit else "duration DESC"
    rows = cur.execute(
        f"SELECT seq, kind, component, lane, start, duration, step, error IS NOT NULL FROM events WHERE {where} "
        f"ORDER BY {order} LIMIT {limit}",
        params,
    ).fetchall()
    groups = _groups(cur, run, rows)
    events = [
        {
            "seq": seq,
            "kind": kind,
            "lane": f"{component}|{lane}",
            "start": ev_start,
            "duration": duration,
            "step": step,
            "error": failed,
            "group": groups.get(seq),
        }
        for seq, kind, component, lane, ev_start, duration, step, failed in rows
    ]
    lanes: dict[str, dict[str, Any]] = {STEPS_LANE["id"]: dict(STEPS_LANE)}
    all_lanes = cur.execute(
        "SELECT DISTINCT component, lane FROM event_bins WHERE run_id = ? AND width = ?", [run, BIN_WIDTHS[-1]]
    ).fetchall()
    for component, lane in all_lanes:  # lanes stay in place when the window has none of their events
        lanes.setdefault(f"{component}|{lane}", {"id": f"{component}|{lane}", "component": component, "lane": lane})
    ordered = sorted(
        lanes.values(), key=lambda la: (_component_rank(la["component"]), la["lane"] != "steps", la["lane"])
    )
    truncated = count > len(events)
    visible_steps = [s for s in steps if s["end"] >= window_start and s["start"] <= window_end]
    return fast_json(
        {
            "range": {"start": lo, "end": hi},
            "window": {"start": window_start, "end": window_end},
            "lanes": ordered,
            "events": events,
            "bins": _bins(cur, run, window_start, window_end, buckets, [lane["id"] for lane in ordered])
            if truncated
            else None,
            "steps": visible_steps,
            "truncated": truncated,
            "total": count,
        }
    )


@router.get("/events/{run}/{seq}")
def event_detail(run: str, seq: int, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> dict[str, Any]:
    """Every field of one event."""
    run_row(cur, run)
    row = cur.execute(
        "SELECT seq, kind, component, lane, start, duration, step, sandbox_id, error, record_json "
        "FROM events WHERE run_id = ? AND seq = ?",
        [run, seq],
    ).fetchone()
    if row is None:
        raise HTTPException(404, f"no event {seq} in run {run!r}")
    keys = ["seq", "kind", "component", "lane", "start", "duration", "step", "sandbox_id", "error"]
    return {**dict(zip(keys, row[:-1], strict=True)), "fields": _fields(row[-1])}


def _fields(record_json: str | None) -> dict[str, Any]:
    """An event's fields other than those with columns of their own."""
    record = json.loads(record_json or "{}")
    return {key: value for key, value in record.items() if key not in EVENT_COLUMNS} if isinstance(record, dict) else {}


SANDBOX_WHERE = "run_id = ? AND (kind LIKE 'sandbox.%' OR sandbox_id IS NOT NULL)"


def _failed_sql() -> str:
    return "(error IS NOT NULL OR coalesce(exit_code, 0) <> 0)"


@router.get("/sandboxes")
def sandboxes(run: str, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> dict[str, Any]:
    """One row per sandbox: lifecycle (first and last event), commands, failures, time executing."""
    run_row(cur, run)
    rows = cur.execute(
        f"SELECT coalesce(sandbox_id, '(none)'), min(start), max(start + duration), "
        f"count(*) FILTER (WHERE kind = 'sandbox.execute'), count(*) FILTER (WHERE {_failed_sql()}), "
        f"coalesce(sum(duration) FILTER (WHERE kind = 'sandbox.execute'), 0), "
        f"bool_or(kind = 'sandbox.destroy'), string_agg(DISTINCT kind, ',') "
        f"FROM events WHERE {SANDBOX_WHERE} GROUP BY 1 ORDER BY 2",
        [run],
    ).fetchall()
    keys = ["sandbox_id", "first", "last", "commands", "failures", "execute_s", "destroyed", "kinds"]
    return {"sandboxes": [dict(zip(keys, row, strict=True)) for row in rows]}


@router.get("/sandboxes/{run}/{sandbox_id}")
def sandbox_events(run: str, sandbox_id: str, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> dict[str, Any]:
    """The events of one sandbox, in time order, with their fields (command, exit code, output, ...)."""
    run_row(cur, run)
    rows = cur.execute(
        f"SELECT seq, kind, start, duration, error, record_json, {_failed_sql()} FROM events "
        f"WHERE {SANDBOX_WHERE} AND coalesce(sandbox_id, '(none)') = ? ORDER BY start LIMIT 5000",
        [run, sandbox_id],
    ).fetchall()
    return {
        "sandbox_id": sandbox_id,
        "events": [
            {"seq": s, "kind": k, "start": t, "duration": d, "error": e, "fields": _fields(f), "failed": x}
            for s, k, t, d, e, f, x in rows
        ],
    }


@router.get("/infra")
def infra(
    run: str, max_points: int = Query(600, ge=10, le=100000), cur: duckdb.DuckDBPyConnection = Depends(cursor)
) -> dict[str, Any]:
    """System, GPU, torch-memory and inference-server series (from ``infra.*`` events), by time."""
    run_row(cur, run)
    rows = cur.execute(
        f"""
        WITH s AS (SELECT kind, source, name, time, value FROM system_metrics WHERE run_id = $run),
        b AS (SELECT kind, source, name, min(time) OVER (PARTITION BY kind, source, name) AS lo,
                     max(time) OVER (PARTITION BY kind, source, name) AS hi, time, value FROM s)
        SELECT kind, source, name, list(t ORDER BY t), list(v ORDER BY t) FROM (
            SELECT kind, source, name, avg(time) AS t, avg(value) AS v FROM b
            GROUP BY kind, source, name, floor((time - lo) / nullif(hi - lo, 0) * {max_points - 1})
        ) GROUP BY kind, source, name ORDER BY kind, name, source
        """,
        {"run": run},
    ).fetchall()
    return {"series": [{"kind": k, "source": s, "name": n, "t": t, "v": v} for k, s, n, t, v in rows]}
