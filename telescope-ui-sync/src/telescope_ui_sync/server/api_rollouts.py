"""Rollout routes: steps, one step's samples, one sample in full, and full-text search.

Search is a case-insensitive substring match over the prompt, the completion and the
tool/environment output of every rollout of a run: one ``contains`` scan of the
``search_text`` column (those texts, lowercased once at sync; DuckDB's ``fts`` extension
would have to be downloaded at run time and matches words, not substrings), with the
total from the same scan. The page of results shown is then read from the records, with
the field that matched and a snippet around the first hit.
Discarded rollouts (records with a ``discard_reason``) are served by the same routes
with ``discarded=true``.

A rollout's attachments (a browser episode's screenshots: the records' ``attachments``,
files under the run directory's ``media/``, see :mod:`telescope.recording.attachments`)
are served by ``/media`` from the run directory as they are, read when asked (never
synced into the database). Only a relative path under ``media/`` is served: an absolute
path, a ``..`` segment or another folder is refused (400), and so is a path a symlink
leads out of ``media/`` (403, checked on the resolved path). The content type comes from
the file's suffix, from a short list of types a browser shows without running anything
(images; text, HTML included, as plain text); any other file is sent as a download.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

import duckdb
from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import FileResponse, Response

from telescope.recording.attachments import MEDIA_DIR
from telescope_ui_sync.server.deps import cursor, fast_json, inside, run_row
from telescope_ui_sync.sync.records import message_text, tool_text

router = APIRouter(prefix="/api/rollouts")

SAMPLE_COLUMNS = (
    "seq, step, group_index, rollout_index, sample_id, environment, reward, advantage, stop_reason, num_turns, "
    "prompt_tokens, completion_tokens, total_tokens, policy_version, error, discard_reason, sample_metrics_json"
)
_NAMES = [c.strip() for c in SAMPLE_COLUMNS.split(",")]
SNIPPET = 80
#: The content type of an attachment by its suffix; any other file is sent as a download.
#: HTML is sent as text (a page kept with a rollout is shown as its source, never run).
MEDIA_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".txt": "text/plain; charset=utf-8",
    ".html": "text/plain; charset=utf-8",
    ".json": "application/json",
}
DOWNLOAD = "application/octet-stream"


def _kept(discarded: bool) -> str:
    return "discard_reason IS NOT NULL" if discarded else "discard_reason IS NULL"


@router.get("/steps")
def steps(run: str, discarded: bool = False, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> Response:
    """The steps that have rollouts, with count and mean reward."""
    run_row(cur, run)
    rows = cur.execute(
        f"SELECT step, count(*), avg(reward) FROM rollouts WHERE run_id = ? AND {_kept(discarded)} "
        "GROUP BY step ORDER BY step",
        [run],
    ).fetchall()
    return fast_json({"steps": [{"step": s, "count": c, "reward_mean": r} for s, c, r in rows]})


@router.get("")
def step_samples(
    run: str, step: int | None = None, discarded: bool = False, cur: duckdb.DuckDBPyConnection = Depends(cursor)
) -> dict[str, Any]:
    """The samples of one step (the last step with rollouts when ``step`` is omitted), without their texts."""
    run_row(cur, run)
    if step is None:
        found = cur.execute(f"SELECT max(step) FROM rollouts WHERE run_id = ? AND {_kept(discarded)}", [run]).fetchone()
        step = found[0] if found else None
    if step is None:
        return {"step": None, "samples": []}
    rows = cur.execute(
        f"SELECT {SAMPLE_COLUMNS} FROM rollouts WHERE run_id = ? AND step = ? AND {_kept(discarded)} "
        "ORDER BY group_index, rollout_index, seq",
        [run, step],
    ).fetchall()
    samples = []
    for row in rows:
        sample = dict(zip(_NAMES, row, strict=True))
        sample["sample_metrics"] = json.loads(sample.pop("sample_metrics_json") or "{}")
        samples.append(sample)
    return {"step": step, "samples": samples}


@router.get("/sample")
def sample(run: str, seq: int, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> dict[str, Any]:
    """One rollout as recorded (prompt, completion, messages, metrics, ...)."""
    run_row(cur, run)
    row = cur.execute(
        f"SELECT {SAMPLE_COLUMNS}, record_json FROM rollouts WHERE run_id = ? AND seq = ?", [run, seq]
    ).fetchone()
    if row is None:
        raise HTTPException(404, f"no rollout {seq} in run {run!r}")
    summary = dict(zip(_NAMES, row[:-1], strict=True))
    summary["sample_metrics"] = json.loads(summary.pop("sample_metrics_json") or "{}")
    return {"summary": summary, "record": json.loads(row[-1])}


def _snippet(text: str, query: str) -> str:
    at = text.lower().find(query.lower())
    if at < 0:
        return text[: 2 * SNIPPET]
    start = max(0, at - SNIPPET)
    end = min(len(text), at + len(query) + SNIPPET)
    return ("…" if start else "") + text[start:end] + ("…" if end < len(text) else "")


@router.get("/search")
def search(
    run: str,
    q: str = Query(..., min_length=1, max_length=500),
    discarded: bool | None = None,
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(0, ge=0),
    cur: duckdb.DuckDBPyConnection = Depends(cursor),
) -> dict[str, Any]:
    """Rollouts whose prompt, completion or tool output contains ``q`` (case-insensitive)."""
    run_row(cur, run)
    kept = "" if discarded is None else f" AND {_kept(discarded)}"
    where = f"run_id = $run AND contains(search_text, lower($q)){kept}"
    params = {"run": run, "q": q}
    rows = cur.execute(
        f"SELECT seq, step, group_index, rollout_index, reward, advantage, discard_reason, record_json, "
        f"count(*) OVER () FROM rollouts WHERE {where} ORDER BY step, group_index, rollout_index, seq "
        f"LIMIT {limit} OFFSET {offset}",
        params,
    ).fetchall()
    if rows or offset == 0:
        total = rows[0][-1] if rows else 0
    else:  # a page past the end: count apart
        (total,) = cur.execute(f"SELECT count(*) FROM rollouts WHERE {where}", params).fetchone() or (0,)
    results = []
    needle = q.lower()
    for seq, step, group, index, reward, advantage, discard, record_json, _ in rows:
        record = json.loads(record_json)
        texts = (
            ("completion", message_text(record.get("completion"))),
            ("prompt", message_text(record.get("prompt"))),
            ("tool", tool_text(record.get("messages"))),
        )
        field, text = next(((f, t) for f, t in texts if needle in t.lower()), texts[0])
        results.append(
            {
                "seq": seq,
                "step": step,
                "group_index": group,
                "rollout_index": index,
                "reward": reward,
                "advantage": advantage,
                "discard_reason": discard,
                "field": field,
                "snippet": _snippet(text, q),
            }
        )
    return {"query": q, "total": total, "results": results}


@router.get("/media")
def media(run: str, path: str, cur: duckdb.DuckDBPyConnection = Depends(cursor)) -> FileResponse:
    """One attachment file of the run (``path`` as a rollout record's ``attachments`` give it:
    ``media/step-3/g0-r1-t1-page-1a2b3c4d.png``, relative to the run directory)."""
    base = Path(run_row(cur, run)["path"])
    parts = PurePosixPath(path).parts
    if path.startswith("/") or len(parts) < 2 or parts[0] != MEDIA_DIR or ".." in parts:
        what = f"{path[:200]!r} is not an attachment"
        raise HTTPException(400, f"{what}: only relative paths under the run's {MEDIA_DIR}/ folder are served")
    if not base.is_dir():
        raise HTTPException(410, "the run directory has been deleted")
    target = inside(base, path)  # 403 for a symlink that leads out of the run directory
    if not target.is_relative_to(base.resolve() / MEDIA_DIR):
        raise HTTPException(403, f"{path[:200]!r} leads out of the run's {MEDIA_DIR}/ folder")
    if not target.is_file():
        raise HTTPException(404, f"no file {path[:200]!r} in run {run!r}")
    media_type = MEDIA_TYPES.get(target.suffix.lower(), DOWNLOAD)
    headers = {"Cache-Control": "private, max-age=3600"}
    if media_type == DOWNLOAD:
        headers["Content-Disposition"] = "attachment"
    return FileResponse(target, media_type=media_type, headers=headers)
