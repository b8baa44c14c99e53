"""Rollout routes: steps, one step's samples, one sample in full, and full-text search.

Search is a case-insensitive substring match over the prompt, the completion and the
tool/environment output of every rollout of a run: one ``contains`` scan of the
``search_text`` column (those texts, lowercased once at sync; DuckDB's ``fts`` extension
would have to be downloaded at run time and matches words, not substrings), with the
total from the same scan. The page of results shown is then read from the records, with
the field that matched and a snippet around the first hit.
Discarded rollouts (records with a ``discard_reason``) are served by the same routes
with ``discarded=true``.
"""

from __future__ import annotations

import json
from typing import Any

import duckdb
from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import Response

from telescope_ui_sync.server.deps import cursor, fast_json, run_row
from telescope_ui_sync.sync.records import message_text, tool_text

router = APIRouter(prefix="/api/rollouts")

SAMPLE_COLUMNS = (
    "seq, step, group_index, rollout_index, sample_id, environment, reward, advantage, stop_reason, num_turns, "
    "prompt_tokens, completion_tokens, total_tokens, policy_version, error, discard_reason, sample_metrics_json"
)
_NAMES = [c.strip() for c in SAMPLE_COLUMNS.split(",")]
SNIPPET = 80


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
