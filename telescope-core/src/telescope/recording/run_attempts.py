"""Attempts: which rows of a run directory are current after a trainer restart or a resume.

A run that restarts its trainer group, or is resumed, goes back to its last checkpoint's
step and trains the steps after it again. The rows the abandoned training wrote for those
steps stay in the append-only files (``metrics.jsonl``, ``rollouts/``); the new ones are
appended after them. So every (re)start of training is an *attempt*:

- ``attempts.json`` in the run directory lists them, in order: ``attempt`` (0, 1, ...),
  ``start_step`` (the step it trains first: 0, or the checkpoint's), ``reason`` (``start``,
  ``resume``, ``trainer_restart``), ``time`` and ``pid``. It is replaced atomically.
- every metrics row and rollout record carries its ``attempt``; a row without one (written
  before attempts existed) counts as attempt 0.
- a row of attempt ``a`` at step ``s`` is *abandoned* when a later attempt started at a step
  ``<= s`` (it trained step ``s`` again, or will); every other row is *current*
  (:func:`superseded_from`, :func:`is_abandoned`).

Readers (:class:`~telescope.recording.run_reader.RunReader`, the dashboard) show the
current rows and give the abandoned ones on request. Nothing is deleted: the abandoned rows
are what the run did, and they stay readable as such.

Limits: evals and timeline events are not filtered (an eval row names the weights it
measured, and the timeline is the history of what ran, restarts included).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from telescope.recording.jsonl import write_atomic

ATTEMPTS_FILE = "attempts.json"
#: The field of a metrics row or rollout record that names the attempt that wrote it.
ATTEMPT_FIELD = "attempt"

AttemptReason = Literal["start", "resume", "trainer_restart", "unrecorded"]


@dataclass(frozen=True)
class Attempt:
    """One (re)start of training in a run directory."""

    attempt: int
    start_step: int
    reason: str
    time: float | None = None
    pid: int | None = None


def read_attempts(run_dir: Path) -> list[Attempt]:
    """The attempts ``attempts.json`` lists (``[]`` for a run without it, or with an unreadable one)."""
    try:
        data = json.loads((run_dir / ATTEMPTS_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return []
    entries = data.get("attempts") if isinstance(data, dict) else None
    attempts = []
    for entry in entries if isinstance(entries, list) else []:
        try:
            number, start_step = int(entry["attempt"]), int(entry["start_step"])
        except (KeyError, TypeError, ValueError):
            continue  # a hand-edited entry: the others still apply
        attempts.append(Attempt(number, start_step, str(entry.get("reason", "")), entry.get("time"), entry.get("pid")))
    return attempts


def record_attempt(run_dir: Path, start_step: int, reason: AttemptReason, *, had_rows: bool) -> Attempt:
    """Append a new attempt starting at ``start_step`` to ``attempts.json``; returns it.

    ``had_rows``: the directory already holds rows. With no attempt listed, they were written
    before attempts existed: they are listed as attempt 0 (``unrecorded``, from step 0) first.
    """
    attempts = read_attempts(run_dir)
    if not attempts and had_rows:
        attempts.append(Attempt(0, 0, "unrecorded"))
    number = attempts[-1].attempt + 1 if attempts else 0
    new = Attempt(number, int(start_step), reason, time.time(), os.getpid())
    attempts.append(new)
    body = {"attempts": [asdict(a) for a in attempts]}
    write_atomic(run_dir / ATTEMPTS_FILE, json.dumps(body, indent=2) + "\n")
    return new


def superseded_from(attempts: Iterable[Attempt]) -> dict[int, int]:
    """For each attempt that a later one went back on: the first step of its rows that are abandoned.

    That is the lowest ``start_step`` of the attempts after it. An attempt absent from the
    result has only current rows (the last attempt, and any that no later one went back on).
    """
    ordered = sorted(attempts, key=lambda a: a.attempt)
    result: dict[int, int] = {}
    lowest: int | None = None
    for attempt in reversed(ordered):
        if lowest is not None:
            result[attempt.attempt] = lowest
        lowest = attempt.start_step if lowest is None else min(lowest, attempt.start_step)
    return result


def row_attempt(record: Mapping[str, Any]) -> int:
    """The attempt that wrote a row (0 for a row written before attempts existed)."""
    value = record.get(ATTEMPT_FIELD)
    return value if isinstance(value, int) else 0


def is_abandoned(record: Mapping[str, Any], superseded: Mapping[int, int]) -> bool:
    """Whether a row (with a ``step``) was written by an attempt that a later one went back on."""
    first = superseded.get(row_attempt(record))
    step = record.get("step")
    return first is not None and isinstance(step, int) and step >= first


def current_rows(records: Iterable[dict[str, Any]], superseded: Mapping[int, int]) -> list[dict[str, Any]]:
    """The rows of ``records`` that are current (in their order)."""
    return [r for r in records if not is_abandoned(r, superseded)]
