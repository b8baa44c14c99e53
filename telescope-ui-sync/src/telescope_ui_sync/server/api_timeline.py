"""Timeline, event, sandbox and infra routes.

The timeline is served by time window: lanes are (component, lane) pairs (a server, a
rank, a sandbox, ...; see :func:`telescope_ui_sync.sync.records.event_lane`), plus a
"trainer / steps" lane built from the step metrics (each step ends at its metrics' time
and lasts ``timing_step_total``), so a run that records no events still has a timeline.
A window with more than ``limit`` events returns the ``limit`` longest ones and says
``truncated`` (zooming in shows the rest), which bounds the browser's work at any zoom.
"""

from __future__ import annotations

import json
from typing import Any

import duckdb
from fastapi import APIRouter, Depends, HTTPException, Query

from telescope_ui_sync.server.deps import cursor, run_row

router = APIRouter(prefix="/api")

COMPONENT_ORDER = ("trainer", "orchestrator", "inference", "sandbox", "tool", "reward", "weights", "system")
STEPS_LANE = {"id": "trainer|steps", "component": "trainer", "lane": "steps"}


def _component_rank(component: str) -> tuple[int, str]:
    return (COMPONENT_ORDER.index(component) if component in COMPONENT_ORDER else len(COMPONENT_ORDER), component)


def _steps(cur: duckdb.DuckDBPyConnection, run: str) -> list[dict[str, Any]]:
    rows = cur.execute(
        "SELECT step, any_value(time), max(CASE WHEN name = 'timing_step_total' THEN value END) "
        "FROM metrics WHERE run_id = ? AND time IS NOT NULL GROUP BY step ORDER BY step",
        [run],
    ).fetchall()
    steps = []
    previous_end: float | None = None
    for step, end, duration in rows:
        start = end - duration if duration is not None else previous_end if previous_end is not None else end
        steps.append({"step": step, "start": start, "end": end})
        previous_end = end
    return steps


@router.get("/timeline")
def timeline(
    run: str,
    start: float | None = None,
    end: float | None = None,
    limit: int = Query(20000, ge=1, le=200000),
    cur: duckdb.DuckDBPyConnection = Depends(cursor),
) -> dict[str, Any]:
    """Lanes and events overlapping [start, end] (the whole run when omitted)."""
    run_row(cur, run)
    lo, hi = cur.execute(
        "SELECT min(start), max(start + duration) FROM events WHERE run_id = ? AND kind NOT LIKE 'infra.%'", [run]
    ).fetchone() or (None, None)
    steps = _steps(cur, run)
    if steps:
        lo = min(x for x in (lo, steps[0]["start"]) if x is not None)
        hi = max(x for x in (hi, steps[-1]["end"]) if x is not None)
    window_start = start if start is not None else lo
    window_end = end if end is not None else hi
    if window_start is None or window_end is None:
        return {"range": None, "window": None, "lanes": [], "events": [], "steps": [], "truncated": False}
    where = "run_id = $run AND kind NOT LIKE 'infra.%' AND start <= $end AND start + duration >= $start"
    params = {"run": run, "start": window_start, "end": window_end}
    (count,) = cur.execute(f"SELECT count(*) FROM events WHERE {where}", params).fetchone() or (0,)
    rows = cur.execute(
        f"SELECT seq, kind, component, lane, start, duration, step, error IS NOT NULL FROM events WHERE {where} "
        f"ORDER BY duration DESC LIMIT {limit}",
        params,
    ).fetchall()
    lanes: dict[str, dict[str, Any]] = {STEPS_LANE["id"]: dict(STEPS_LANE)}
    events = []
    for seq, kind, component, lane, ev_start, duration, step, failed in rows:
        lane_id = f"{component}|{lane}"
        lanes.setdefault(lane_id, {"id": lane_id, "component": component, "lane": lane})
        events.append({"seq": seq, "kind": kind, "lane": lane_id, "start": ev_start, "duration": duration,
                       "step": step, "error": failed})  # fmt: skip
    all_lanes = cur.execute(
        "SELECT DISTINCT component, lane FROM events WHERE run_id = ? AND kind NOT LIKE 'infra.%'", [run]
    ).fetchall()
    for component, lane in all_lanes:  # lanes stay in place when the window has none of their events
        lanes.setdefault(f"{component}|{lane}", {"id": f"{component}|{lane}", "component": component, "lane": lane})
    ordered = sorted(lanes.values(), key=lambda la: (_component_rank(la["component"]), la["lane"] != "steps",
                                                    la["lane"]))  # fmt: skip
    visible_steps = [s for s in steps if s["end"] >= window_start and s["start"] <= window_end]
    return {
        "range": {"start": lo, "end": hi},
        "window": {"start": window_start, "end": window_end},
        "lanes": ordered,
        "events": events,
        "steps": visible_steps,
        "truncated": count > len(events),
        "total": count,
    }


@router.get("/events/{run}/{seq}")
def event_detail(run: str, seq: int, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> dict[str, Any]:
    """Every field of one event."""
    run_row(cur, run)
    row = cur.execute(
        "SELECT seq, kind, component, lane, start, duration, step, sandbox_id, error, fields_json "
        "FROM events WHERE run_id = ? AND seq = ?",
        [run, seq],
    ).fetchone()
    if row is None:
        raise HTTPException(404, f"no event {seq} in run {run!r}")
    keys = ["seq", "kind", "component", "lane", "start", "duration", "step", "sandbox_id", "error"]
    return {**dict(zip(keys, row[:-1], strict=True)), "fields": json.loads(row[-1] or "{}")}


SANDBOX_WHERE = "run_id = ? AND (kind LIKE 'sandbox.%' OR sandbox_id IS NOT NULL)"


def _failed_sql() -> str:
    return "(error IS NOT NULL OR coalesce(TRY_CAST(json_extract(fields_json, '$.exit_code') AS BIGINT), 0) <> 0)"


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
        f"SELECT seq, kind, start, duration, error, fields_json, {_failed_sql()} FROM events "
        f"WHERE {SANDBOX_WHERE} AND coalesce(sandbox_id, '(none)') = ? ORDER BY start LIMIT 5000",
        [run, sandbox_id],
    ).fetchall()
    return {
        "sandbox_id": sandbox_id,
        "events": [
            {"seq": s, "kind": k, "start": t, "duration": d, "error": e, "fields": json.loads(f or "{}"), "failed": x}
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
