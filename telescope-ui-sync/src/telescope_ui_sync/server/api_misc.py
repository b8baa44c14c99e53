"""Evals and logs routes."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import duckdb
from fastapi import APIRouter, Depends, Query

from telescope_ui_sync.server.deps import cursor, run_row

router = APIRouter(prefix="/api")

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@router.get("/evals")
def evals(run: str, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> dict[str, Any]:
    """Every eval result of the run: name, step, phase, time and its metrics."""
    run_row(cur, run)
    rows = cur.execute(
        "SELECT seq, name, step, time, phase, metric, value FROM evals WHERE run_id = ? ORDER BY seq, metric", [run]
    ).fetchall()
    results: dict[int, dict[str, Any]] = {}
    for seq, name, step, at, phase, metric, value in rows:
        entry = results.setdefault(
            seq, {"seq": seq, "name": name, "step": step, "time": at, "phase": phase, "metrics": {}}
        )
        entry["metrics"][metric] = value
    by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in results.values():
        by_name[entry["name"] or "?"].append(entry)
    return {"evals": list(results.values()), "names": sorted(by_name)}


@router.get("/logs")
def logs(
    run: str,
    component: str | None = None,
    levels: str | None = Query(None, description="comma-separated levels; NONE selects lines without one"),
    q: str | None = Query(None, max_length=500),
    offset: int = Query(0, ge=0),
    limit: int = Query(500, ge=1, le=5000),
    cur: duckdb.DuckDBPyConnection = Depends(cursor),
) -> dict[str, Any]:
    """Log lines of the run, filtered by component (log file), level and text, in file order."""
    run_row(cur, run)
    clauses = ["run_id = $run"]
    params: dict[str, Any] = {"run": run}
    if component:
        clauses.append("component = $component")
        params["component"] = component
    if levels:
        wanted = [level.strip().upper() for level in levels.split(",") if level.strip()]
        named = [level for level in wanted if level in LEVELS]
        parts = []
        if named:
            parts.append("level IN (" + ",".join(f"'{level}'" for level in named) + ")")
        if "NONE" in wanted:
            parts.append("level IS NULL")
        clauses.append("(" + (" OR ".join(parts) or "FALSE") + ")")
    if q:
        clauses.append("message ILIKE $q ESCAPE '\\'")
        params["q"] = "%" + q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    where = " AND ".join(clauses)
    (total,) = cur.execute(f"SELECT count(*) FROM logs WHERE {where}", params).fetchone() or (0,)
    rows = cur.execute(
        f"SELECT component, line_no, time, level, logger, message FROM logs WHERE {where} "
        f"ORDER BY component, line_no LIMIT {limit} OFFSET {offset}",
        params,
    ).fetchall()
    components = cur.execute(
        "SELECT component, count(*), count(*) FILTER (WHERE level IN ('ERROR', 'CRITICAL')), "
        "count(*) FILTER (WHERE level = 'WARNING') FROM logs WHERE run_id = ? GROUP BY component ORDER BY component",
        [run],
    ).fetchall()
    keys = ["component", "line_no", "time", "level", "logger", "message"]
    return {
        "total": total,
        "lines": [dict(zip(keys, row, strict=True)) for row in rows],
        "components": [{"name": c, "lines": n, "errors": e, "warnings": w} for c, n, e, w in components],
    }
