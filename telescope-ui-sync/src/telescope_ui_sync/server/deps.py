"""What every route needs: a database cursor, the sync service, and run lookup."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
from fastapi import HTTPException, Request
from fastapi.responses import Response

from telescope_ui_sync.sync.syncer import SyncService


@dataclass
class AppState:
    """Held by the app: the shared connection (routes use a cursor each) and the syncer."""

    con: duckdb.DuckDBPyConnection
    service: SyncService | None


def state(request: Request) -> AppState:
    found: AppState = request.app.state.telescope
    return found


def cursor(request: Request) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor of the shared connection for one request (DuckDB cursors are per thread)."""
    cur = state(request).con.cursor()
    try:
        yield cur
    finally:
        cur.close()


RUN_COLUMNS = (
    "run_id, name, path, root, source, status, step, number_of_steps, start_time, end_time, updated_time, "
    "missing, skipped_lines, first_seen, last_sync"
)


def run_row(cur: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    """The run's row as a dict; 404 when no such run was ever synced."""
    row = cur.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        raise HTTPException(404, f"no run {run_id!r}")
    names = [c.strip() for c in RUN_COLUMNS.split(",")]
    return dict(zip(names, row, strict=True))


def run_ids(value: str | None) -> list[str]:
    """A comma-separated list of run ids from a query parameter."""
    return [part for part in (value or "").split(",") if part]


def loads(text: str | None) -> Any:
    return json.loads(text) if text else None


def inside(base: Path, relative: str) -> Path:
    """``base / relative`` if it resolves (symlinks followed) inside ``base``; else 403.

    Absolute paths, ``..`` segments that climb out and symlinks that point outside are
    all refused, so a file route serves only files of the run it names.
    """
    if not relative or "\x00" in relative:
        raise HTTPException(400, "no file named")
    base_resolved = base.resolve()
    target = (base_resolved / relative).resolve()
    if Path(relative).is_absolute() or not target.is_relative_to(base_resolved):
        raise HTTPException(403, "that path is outside the run directory")
    return target


def fast_json(payload: Any) -> Response:
    """``payload`` (plain JSON types only) as a JSON response, encoded by ``json.dumps`` in C.

    FastAPI's default path walks a returned dict with ``jsonable_encoder`` in Python first,
    which costs more than the query for the routes that return thousands of points.
    """
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return Response(body.encode("utf-8"), media_type="application/json")
