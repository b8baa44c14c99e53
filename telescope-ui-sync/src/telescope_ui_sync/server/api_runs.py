"""Routes about runs: the list with progress, one run's summary, removing a deleted run, config diff, files,
health."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import duckdb
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import PlainTextResponse

from telescope_ui_sync.server.deps import cursor, inside, loads, run_row, state
from telescope_ui_sync.sync.schema import delete_run
from telescope_ui_sync.sync.syncer import RunStillPresent

router = APIRouter(prefix="/api")

FINAL = frozenset({"completed", "failed", "interrupted", "died"})
#: Files a run directory may show through /api/files (logs and the config; nothing else).
FILE_PREFIXES: tuple[str, ...] = ("logs/", "config.yaml", "config.json", "status.json")
MAX_FILE_BYTES = 2 * 1024 * 1024


#: Steps the ETA's time per step is taken over (the last ones).
ETA_STEPS = 20


def progress(run: dict[str, Any], now: float | None = None, step_seconds: float | None = None) -> dict[str, Any]:
    """Fraction done, runtime and ETA of a run row.

    The ETA is the steps left times ``step_seconds``, the time a recent step took
    (:func:`step_times`): not the runtime over the steps done, which counts the warm-start,
    the model loading and the evals before the first step as if every step took its share.
    Without step times (a run that writes no ``timing_step_total`` nor step times), the
    runtime over the steps done.
    """
    now = time.time() if now is None else now
    step, total, start = run.get("step"), run.get("number_of_steps"), run.get("start_time")
    end = run.get("end_time")
    runtime = ((end or now) - start) if start else None
    fraction = min(step / total, 1.0) if step is not None and total else None
    eta = None
    if run.get("status") not in FINAL and step and total and step < total:
        if step_seconds is not None:
            eta = step_seconds * (total - step)
        elif runtime:
            eta = runtime / step * (total - step)
    return {"step": step, "total": total, "fraction": fraction, "runtime_s": runtime, "eta_s": eta}


def step_times(cur: duckdb.DuckDBPyConnection, run_id: str | None = None) -> dict[str, float]:
    """Seconds per step of each run (or of ``run_id``) over its last :data:`ETA_STEPS` steps:
    the mean ``timing_step_total``, else the mean spacing of the steps' times."""
    where = "WHERE run_id = $run" if run_id is not None else ""
    rows = cur.execute(
        f"""
        SELECT run_id, avg(duration), (max(time) - min(time)) / nullif(count(time) - 1, 0)
        FROM (SELECT run_id, step, time, duration, row_number() OVER (PARTITION BY run_id ORDER BY step DESC) AS n
              FROM steps {where})
        WHERE n <= $last GROUP BY run_id
        """,
        {"last": ETA_STEPS, **({"run": run_id} if run_id is not None else {})},
    ).fetchall()
    out: dict[str, float] = {}
    for rid, mean_duration, spacing in rows:
        value = mean_duration if mean_duration is not None and mean_duration > 0 else spacing
        if value is not None and value > 0:
            out[rid] = float(value)
    return out


@router.get("/health")
def health(request: Request, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> dict[str, Any]:
    service = state(request).service
    """The server answers; how many runs and sync passes; the last sync error; the blocks skipped as unreadable."""
    (count,) = cur.execute("SELECT count(*) FROM runs").fetchone() or (0,)
    return {
        "ok": True,
        "runs": count,
        "sync_passes": service.passes if service else None,
        "last_error": service.last_error if service else None,
        "bad_blocks": [{"run_id": run_id, **block} for run_id, blocks in bad_blocks(cur).items() for block in blocks],
    }


def bad_blocks(cur: duckdb.DuckDBPyConnection) -> dict[str, list[dict[str, Any]]]:
    """The blocks the syncer skipped because they cannot be read, by run: stream, file and error."""
    out: dict[str, list[dict[str, Any]]] = {}
    rows = cur.execute("SELECT run_id, stream, file, error FROM bad_blocks ORDER BY run_id, stream, file").fetchall()
    for run_id, stream, file, error in rows:
        out.setdefault(run_id, []).append({"stream": stream, "file": file, "error": error})
    return out


@router.get("/runs")
def list_runs(request: Request, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> dict[str, Any]:
    """Every run under the served folders, oldest first, with its progress, the blocks skipped as
    unreadable, and ``data_time``: when the sync last added rows to it (null: not since this
    server started), so that a page of a finished run knows when to load again."""
    service = state(request).service
    roots = service.root_strings if service else None
    rows = cur.execute(
        "SELECT run_id, name, path, root, source, status, step, number_of_steps, start_time, end_time, "
        "updated_time, missing, skipped_lines FROM runs ORDER BY coalesce(start_time, first_seen), run_id"
    ).fetchall()
    names = [
        "run_id",
        "name",
        "path",
        "root",
        "source",
        "status",
        "step",
        "number_of_steps",
        "start_time",
        "end_time",
        "updated_time",
        "missing",
        "skipped_lines",
    ]
    bad = bad_blocks(cur)
    per_step = step_times(cur)
    runs = []
    for row in rows:
        run = dict(zip(names, row, strict=True))
        if roots is not None and run["root"] not in roots:  # synced by a server that served other folders
            continue
        run["progress"] = progress(run, step_seconds=per_step.get(run["run_id"]))
        run["bad_blocks"] = bad.get(run["run_id"], [])
        run["data_time"] = service.changed.get(run["run_id"]) if service else None
        runs.append(run)
    return {"runs": runs, "roots": roots or [], "server_time": time.time()}


def environment_ranges(config: dict[str, Any] | None, metadata: dict[str, Any] | None) -> dict[str, Any]:
    """Declared ranges: ``reward`` per environment and ``metrics`` per sample metric.

    From the config's ``environments`` (``reward_min`` / ``reward_max``) and from
    metadata.json, whose ``environments`` list repeats them with each environment class's
    ``metrics_ranges`` (``{metric: {"min", "max"}}``); a top-level ``metrics_ranges`` counts too.
    """
    reward: dict[str, list[float | None]] = {}
    metrics: dict[str, Any] = {}
    entries = [*((config or {}).get("environments") or []), *((metadata or {}).get("environments") or [])]
    for entry in entries:
        if not isinstance(entry, dict) or not entry.get("name"):
            continue
        if "reward_min" in entry or "reward_max" in entry:
            reward[str(entry["name"])] = [entry.get("reward_min"), entry.get("reward_max")]
        ranges = entry.get("metrics_ranges")
        for metric, bounds in ranges.items() if isinstance(ranges, dict) else ():
            if isinstance(bounds, dict):
                metrics[str(metric)] = [bounds.get("min"), bounds.get("max")]
    top = (metadata or {}).get("metrics_ranges")
    for metric, bounds in top.items() if isinstance(top, dict) else ():
        if isinstance(bounds, dict):
            metrics[str(metric)] = [bounds.get("min"), bounds.get("max")]
    return {"reward": reward, "metrics": metrics}


@router.delete("/runs/{run_id}")
def forget_run(run_id: str, request: Request, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> dict[str, Any]:
    """Remove a run whose directory was deleted from the dashboard (its synced data goes too);
    409 while the directory is still there (the next sync pass would bring the run back)."""
    run = run_row(cur, run_id)
    service = state(request).service
    try:
        if service is not None:
            service.forget(run_id)
        elif run["missing"]:
            delete_run(cur, run_id)
        else:
            raise RunStillPresent(f"the run's directory {run['path']} is still there; delete it first")
    except RunStillPresent as exc:
        raise HTTPException(409, f"{exc}: only a run whose directory was deleted can be removed") from None
    return {"removed": run_id}


@router.get("/runs/{run_id}")
def run_summary(run_id: str, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> dict[str, Any]:
    """One run: its row, progress, config (parsed and as YAML), ranges and how much was synced."""
    run = run_row(cur, run_id)
    extra = cur.execute(
        "SELECT config_json, config_yaml, status_json, metadata_json FROM runs WHERE run_id = ?", [run_id]
    ).fetchone()
    config_json, config_yaml, status_json, metadata_json = extra or (None, None, None, None)
    config, status, metadata = loads(config_json), loads(status_json), loads(metadata_json)
    counts = {}
    for table in ("metrics", "rollouts", "events", "evals", "logs"):
        (counts[table],) = cur.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [run_id]).fetchone() or (0,)
    (counts["steps"],) = cur.execute("SELECT count(*) FROM steps WHERE run_id = ?", [run_id]).fetchone() or (0,)
    logs = [
        row[0]
        for row in cur.execute("SELECT DISTINCT file FROM logs WHERE run_id = ? ORDER BY file", [run_id]).fetchall()
    ]
    return {
        "run": {**run, "progress": progress(run, step_seconds=step_times(cur, run_id).get(run_id))},
        "config": config,
        "config_yaml": config_yaml,
        "status": status,
        "metadata": metadata,
        "ranges": environment_ranges(config, metadata),
        "counts": counts,
        "log_files": logs,
    }


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys (lists stay values)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(flatten(inner, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


@router.get("/config-diff")
def config_diff(a: str, b: str, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> dict[str, Any]:
    """The config keys whose values differ between runs ``a`` and ``b``."""
    configs = []
    for run_id in (a, b):
        run_row(cur, run_id)
        row = cur.execute("SELECT config_json FROM runs WHERE run_id = ?", [run_id]).fetchone()
        configs.append(flatten(loads(row[0]) if row else {}) or {})
    keys = sorted(set(configs[0]) | set(configs[1]))
    missing = object()
    diffs = []
    for key in keys:
        left, right = configs[0].get(key, missing), configs[1].get(key, missing)
        if left != right:
            diffs.append(
                {
                    "key": key,
                    "a": None if left is missing else left,
                    "b": None if right is missing else right,
                    "only_in": "a" if right is missing else "b" if left is missing else None,
                }
            )
    return {"a": a, "b": b, "differences": diffs, "same": len(keys) - len(diffs)}


@router.get("/files/{run_id}", response_class=PlainTextResponse)
def run_file(run_id: str, path: str, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> PlainTextResponse:
    """A log or config file of the run, as text (last 2 MB). Refuses any path outside the run directory."""
    run = run_row(cur, run_id)
    base = Path(run["path"])
    target = inside(base, path)
    relative = target.relative_to(base.resolve()).as_posix()
    if not any(relative == p or (p.endswith("/") and relative.startswith(p)) for p in FILE_PREFIXES):
        raise HTTPException(403, "only the run's logs and config are served")
    if not base.is_dir():
        raise HTTPException(410, "the run directory has been deleted")
    try:
        with target.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - MAX_FILE_BYTES))
            data = handle.read()
    except (FileNotFoundError, IsADirectoryError):
        raise HTTPException(404, f"no file {relative!r} in this run") from None
    return PlainTextResponse(data.decode("utf-8", errors="replace"))
