"""Metric routes: the catalog (names by section and group) and series for charts.

Series are downsampled in DuckDB when a run has more points than ``max_points``: the
x range is cut into ``max_points / 2`` buckets and each bucket gives its minimum and its
maximum point (in x order), so spikes survive (a grad-norm spike is what one looks for)
while the browser gets a bounded number of points. ``max_points=0`` returns every point.
Eval metrics (``eval/<name>/<metric>``) come from the evals table, by step.

Environment and tag filters: the step metrics are aggregates over all of a step's
rollouts, so a filtered chart is computed again from the synced rollouts (those kept for
training that pass the filter), for every metric the rollouts can give (rewards,
advantages, tokens, sample metrics, counts); the others stay as recorded and say so.
"""

from __future__ import annotations

import json
import re
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
    names += [r[0] for r in cur.execute(f"SELECT DISTINCT metric FROM evals WHERE run_id IN ({marks})", ids).fetchall()]
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


STATS = {"mean": "avg({})", "std": "stddev_pop({})", "min": "min({})", "max": "max({})"}
TOKEN_COLUMNS = {"prompt": "prompt_tokens", "completion": "completion_tokens", "total": "total_tokens"}


def derived(name: str) -> tuple[str, dict[str, Any]] | None:
    """The SQL aggregate (over a step's kept rollouts) that computes metric ``name`` again, with
    its parameters; ``None`` for a metric the rollouts cannot give (losses, timings, Gini, ...).

    These are the names of :mod:`telescope.recording.rollout_metrics`: ``reward/``,
    ``advantage/``, ``tokens/<kind>/`` and ``sample_metrics/<key>/`` with ``mean``, ``std``,
    ``min``, ``max`` (population statistics), ``rollouts/count`` and ``stop_reason_length_pct``.
    """
    if name == "rollouts/count":
        return "CAST(count(*) AS DOUBLE)", {}
    if name == "stop_reason_length_pct":
        return "100.0 * avg(CAST(stop_reason = 'length' AS DOUBLE))", {}
    if match := re.fullmatch(r"(reward|advantage)/(mean|std|min|max)", name):
        return STATS[match[2]].format(match[1]), {}
    if match := re.fullmatch(r"tokens/(prompt|completion|total)/(mean|std|min|max)", name):
        return STATS[match[2]].format(TOKEN_COLUMNS[match[1]]), {}
    if match := re.fullmatch(r"sample_metrics/(.+)/(mean|std|min|max)", name):
        value = "TRY_CAST(json_extract_string(sample_metrics_json, $path) AS DOUBLE)"
        return STATS[match[2]].format(value), {"path": "$." + json.dumps(match[1])}
    return None


def filter_sql(envs: list[str], tags: list[str]) -> tuple[str, dict[str, Any]]:
    """SQL conditions on ``rollouts`` for the filters: the environment is one of ``envs``; for each
    tag name in ``tags`` (``name=value`` or ``name``), the rollout has one of the values given."""
    clauses: list[str] = []
    params: dict[str, Any] = {}
    if envs:
        clauses.append("environment IN (SELECT unnest($envs))")
        params["envs"] = envs
    by_name: dict[str, list[str]] = defaultdict(list)
    for tag in tags:
        by_name[tag.split("=", 1)[0]].append(tag)
    for i, values in enumerate(by_name.values()):
        clauses.append(f"list_has_any(coalesce(tags, []), $tags{i})")
        params[f"tags{i}"] = values
    return " AND ".join(clauses), params


def _series_sql(base: str, max_points: int) -> str:
    """SQL giving (x, y) of ``base`` (a query of ``x``, ``y``), downsampled to min/max per bucket when long."""
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


def _base_sql(name: str, x: str, where: str | None) -> tuple[str, dict[str, Any], bool]:
    """(SQL of ``x``, ``y`` for metric ``name`` of run ``$run``, its parameters, whether the
    filter ``where`` applied): the metrics table, the evals table (``eval/...``) or, under a
    filter, the metric computed again from the rollouts that pass it."""
    time_x = "time - (SELECT min(time) FROM steps WHERE run_id = $run)"
    if where:
        found = derived(name)
        if found is not None:
            aggregate, params = found
            base = (
                f"SELECT step, {aggregate} AS y FROM rollouts WHERE run_id = $run AND discard_reason IS NULL "
                f"AND step IS NOT NULL AND {where} GROUP BY step"
            )
            if x == "time":
                base = (
                    f"SELECT {time_x} AS x, y FROM ({base}) JOIN steps USING (step) "
                    "WHERE run_id = $run AND time IS NOT NULL"
                )
            else:
                base = f"SELECT step AS x, y FROM ({base})"
            return f"SELECT x, y FROM ({base}) WHERE y IS NOT NULL", params, True
    if name.startswith("eval/"):
        base = "SELECT step AS x, value AS y FROM evals WHERE run_id = $run AND metric = $name AND step IS NOT NULL"
    elif x == "time":
        base = (
            f"SELECT {time_x} AS x, value AS y FROM metrics WHERE run_id = $run AND name = $name AND time IS NOT NULL"
        )
    else:
        base = "SELECT step AS x, value AS y FROM metrics WHERE run_id = $run AND name = $name"
    return base, {"name": name}, False


@router.get("/filters")
def filters(runs: str = "", cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> dict[str, Any]:
    """The environments and sample tags of the rollouts of ``runs``: what the metrics can be filtered by."""
    ids = run_ids(runs)
    if not ids:
        return {"environments": [], "tags": []}
    envs = cur.execute(
        "SELECT DISTINCT environment FROM rollouts WHERE run_id IN (SELECT unnest($ids)) AND environment IS NOT NULL "
        "ORDER BY 1",
        {"ids": ids},
    ).fetchall()
    tags = cur.execute(
        "SELECT DISTINCT unnest(tags) FROM rollouts WHERE run_id IN (SELECT unnest($ids)) AND tags IS NOT NULL "
        "ORDER BY 1",
        {"ids": ids},
    ).fetchall()
    return {"environments": [e for (e,) in envs], "tags": [t for (t,) in tags]}


@router.get("/series")
def series(
    runs: str,
    names: str,
    x: Literal["step", "time"] = "step",
    max_points: int = Query(DEFAULT_MAX_POINTS, ge=0, le=1_000_000),
    env: list[str] | None = Query(None, description="keep rollouts of these environments"),
    tag: list[str] | None = Query(None, description="keep rollouts with these tags (name=value or name)"),
    cur: duckdb.DuckDBPyConnection = Depends(cursor),
) -> Response:
    """``{"series": [{run_id, name, x: [...], y: [...], filtered}]}`` for each run and metric name.

    With ``env`` or ``tag`` filters, the metrics that the rollouts can give (see :func:`derived`)
    are computed again per step from the kept rollouts that pass them (``filtered``: true);
    the others are returned as recorded (``filtered``: false).
    """
    where, filter_params = filter_sql(env or [], tag or [])
    out = []
    for run_id in run_ids(runs):
        for name in [n for n in names.split(",") if n]:
            base, params, filtered = _base_sql(name, x, where or None)
            params = {"run": run_id, **params, **(filter_params if filtered else {})}
            rows = cur.execute(_series_sql(base, max_points), params).fetchall()
            xs: list[Any] = []
            ys: list[Any] = []
            last_x = None
            for px, py in rows:
                if px == last_x and xs:  # a bucket whose min and max are the same point
                    continue
                xs.append(px)
                ys.append(py)
                last_x = px
            out.append({"run_id": run_id, "name": name, "x": xs, "y": ys, "filtered": filtered})
    return fast_json({"series": out, "x": x})
