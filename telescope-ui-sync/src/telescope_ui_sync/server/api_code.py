"""The code snapshot of a run (``code/``, written by :mod:`telescope.recording.run_metadata`):
its files, one file's text, and what changed between the snapshots of two runs.

The files are read from the run directory when asked (the snapshot is a copy of the
source tree, not synced into the database); a path outside the snapshot is refused, as
by the other file routes. The diff of one file is unified, computed with :mod:`difflib`.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import duckdb
from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import PlainTextResponse

from telescope.recording.run_reader import RunReader
from telescope_ui_sync.server.deps import cursor, inside, loads, run_row

router = APIRouter(prefix="/api")

MAX_CODE_BYTES = 2 * 1024 * 1024


def _reader(cur: duckdb.DuckDBPyConnection, run_id: str) -> RunReader:
    run = run_row(cur, run_id)
    if not Path(run["path"]).is_dir():
        raise HTTPException(410, "the run directory has been deleted")
    return RunReader(run["path"])


def _read(reader: RunReader, relative: str) -> bytes | None:
    """The bytes of snapshot file ``relative`` (None when absent); 403 for a path outside the snapshot."""
    target = inside(reader.code_dir, relative)
    try:
        with target.open("rb") as handle:
            return handle.read(MAX_CODE_BYTES + 1)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def _text(data: bytes | None) -> str:
    if data is None:
        return ""
    text = data[:MAX_CODE_BYTES].decode("utf-8", errors="replace")
    return text + ("\n… (cut at 2 MB)\n" if len(data) > MAX_CODE_BYTES else "")


@router.get("/code/{run_id}")
def code_files(run_id: str, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> dict[str, Any]:
    """The snapshot's files (paths relative to ``code/``), its summary and the run's git state."""
    reader = _reader(cur, run_id)
    row = cur.execute("SELECT metadata_json FROM runs WHERE run_id = ?", [run_id]).fetchone()
    metadata = (loads(row[0]) if row else None) or reader.metadata() or {}
    return {"files": reader.code_files(), "summary": metadata.get("code"), "git": metadata.get("git")}


@router.get("/code/{run_id}/file", response_class=PlainTextResponse)
def code_file(run_id: str, path: str, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> PlainTextResponse:
    """One file of the snapshot, as text (the first 2 MB)."""
    data = _read(_reader(cur, run_id), path)
    if data is None:
        raise HTTPException(404, f"no file {path!r} in the code of this run")
    return PlainTextResponse(_text(data))


@router.get("/code-diff")
def code_diff(
    a: str, b: str, path: str | None = None, cur: duckdb.DuckDBPyConnection = Depends(cursor)
) -> dict[str, Any]:
    """The files that differ between the snapshots of runs ``a`` and ``b`` (added, removed,
    modified); with ``path``, that file's unified diff."""
    left, right = _reader(cur, a), _reader(cur, b)
    if path is not None:
        old, new = _read(left, path), _read(right, path)
        if old is None and new is None:
            raise HTTPException(404, f"no file {path!r} in the code of either run")
        lines = difflib.unified_diff(
            _text(old).splitlines(keepends=True),
            _text(new).splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
        return {"path": path, "diff": "".join(lines)}
    left_files, right_files = set(left.code_files()), set(right.code_files())
    changed = [{"path": p, "status": "removed"} for p in sorted(left_files - right_files)]
    changed += [{"path": p, "status": "added"} for p in sorted(right_files - left_files)]
    same = 0
    for relative in sorted(left_files & right_files):
        if _read(left, relative) == _read(right, relative):
            same += 1
        else:
            changed.append({"path": relative, "status": "modified"})
    changed.sort(key=lambda item: item["path"])
    return {"a": a, "b": b, "changed": changed, "same": same}
