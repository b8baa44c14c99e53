"""Metric routes: the catalog (names by section and group) and series for charts.

Series are downsampled in DuckDB when a run has more points than ``max_points``: the
x range is cut into ``max_points / 2`` buckets and each bucket gives its minimum and its
maximum point (in x order), so spikes survive (a grad-norm spike is what one looks for)
while the browser gets a bounded number of points. ``max_points=0`` returns every point.
Eval metrics (``eval/<name>/<metric>``) come from the evals table, by step.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Literal

import duckdb
from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from telescope_ui_sync.catalog import classify, section_rank
from telescope_ui_sync.server.deps import cursor, fast_json, run_ids

router = APIRouter(prefix="/api/metrics")

DEFAULT_MAX_POINTS = 4000


@router.get("/catalog")
def catalog(runs: str = "", cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> dict[str, Any]:
    """Metric names of ``runs`` (comma-separated ids), grouped into the Metrics page's sections."""
    ids = run_ids(runs)
    if not ids:
        return {"sections": []}
    marks = ",".join("?" * len(ids))
    names = [r[0] for r in cur.execute(f"SELECT DISTINCT name FROM metrics WHERE run_id IN ({marks})", ids).fetchall()]
    names += [r[0] for r in cur.execute(
        f"SELECT DISTINCT metric FROM evals WHERE run_id IN ({marks})", ids).fetchall()]  # fmt: skip
    sections: dict[str, dict[str, list[dict[str, str]]]] = defaultdict(lambda: defaultdict(list))
    for name in sorted(set(names)):
        place = classify(name)
        sections[place.section][place.group].append({"name": name, "label": place.label})
    ordered = []
    for section in sorted(sections, key=section_rank):
        groups = sections[section]
        ordered.append(
            {
                "name": section,
                "groups": [{"name": g, "metrics": groups[g]} for g in sorted(groups, key=lambda g: (g != "", g))],
            }
        )
    return {"sections": ordered}


def _series_sql(source: str, x: str, max_points: int) -> str:
    """SQL giving (x, y) of one (run, name), downsampled to min/max per bucket when long."""
    if source == "evals":
        base = "SELECT step AS x, value AS y FROM evals WHERE run_id = $run AND metric = $name AND step IS NOT NULL"
    elif x == "time":
        base = (
            "SELECT time - (SELECT min(time) FROM metrics WHERE run_id = $run) AS x, value AS y "
            "FROM metrics WHERE run_id = $run AND name = $name AND time IS NOT NULL"
        )
    else:
        base = "SELECT step AS x, value AS y FROM metrics WHERE run_id = $run AND name = $name"
    if max_points <= 0:
        return f"SELECT x, y FROM ({base}) ORDER BY x"
    buckets = max(1, max_points // 2)
    return f"""
        WITH s AS ({base}),
        n AS (SELECT count(*) AS n, min(x) AS lo, max(x) AS hi FROM s)
        SELECT x, y FROM s WHERE (SELECT n FROM n) <= {max_points}
        UNION ALL
        SELECT unnest([arg_min(x, y), arg_max(x, y)]) AS x, unnest([min(y), max(y)]) AS y
        FROM s, n WHERE n.n > {max_points}
        GROUP BY floor((x - n.lo) / nullif(n.hi - n.lo, 0) * {buckets - 1})
        ORDER BY x
    """


@router.get("/series")
def series(
    runs: str,
    names: str,
    x: Literal["step", "time"] = "step",
    max_points: int = Query(DEFAULT_MAX_POINTS, ge=0, le=1_000_000),
    cur: duckdb.DuckDBPyConnection = Depends(cursor),
) -> Response:
    """``{"series": [{run_id, name, x: [...], y: [...]}]}`` for each run and metric name."""
    out = []
    for run_id in run_ids(runs):
        for name in [n for n in names.split(",") if n]:
            source = "evals" if name.startswith("eval/") else "metrics"
            rows = cur.execute(_series_sql(source, x, max_points), {"run": run_id, "name": name}).fetchall()
            xs: list[Any] = []
            ys: list[Any] = []
            last_x = None
            for px, py in rows:
                if px == last_x and xs:  # a bucket whose min and max are the same point
                    continue
                xs.append(px)
                ys.append(py)
                last_x = px
            out.append({"run_id": run_id, "name": name, "x": xs, "y": ys})
    return fast_json({"series": out, "x": x})
