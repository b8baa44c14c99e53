"""Run-store records as rows of the DuckDB tables (see :mod:`.schema`), in Python.

The volume (rollouts, events, metrics) is ingested in DuckDB and Arrow by :mod:`.ingest`;
what is here reads the small streams (evals, logs), is the fallback of :mod:`.ingest` for
a batch Arrow cannot parse, and gives the texts the API shows (a prompt or message list
as text). Each ``*_columns`` function returns a ``pyarrow.Table`` in the column order of
its table. Unknown or malformed fields never raise: a record missing ``step`` is dropped
from ``metrics``, a non-numeric metric is not a metric, a field of an unexpected type
becomes NULL.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from telescope.recording.run_attempts import ATTEMPT_FIELD

Record = dict[str, Any]

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode

#: Event fields with columns of their own (the event detail lists the others).
EVENT_COLUMNS = frozenset({"kind", "start", "duration_s", "component", "step", "sandbox_id", "error"})
#: Fields that name the lane of an event inside its component, in order of preference.
LANE_FIELDS: tuple[str, ...] = ("server", "rank", "sandbox_id", "worker", "node", "host", "lane")


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def _integer(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else _dumps(value)


def metrics_columns(run_id: str, records: Iterable[Record]) -> pa.Table:
    """Long rows (run_id, step, time, name, value) of every numeric field of each step record."""
    steps: list[int] = []
    times: list[float | None] = []
    names: list[str] = []
    values: list[float] = []
    for record in records:
        step = _integer(record.get("step"))
        if step is None:
            continue
        at = _number(record.get("time"))
        for name, raw in record.items():
            if name == "step" or name == "time" or name == ATTEMPT_FIELD:
                continue
            if raw.__class__ is float or raw.__class__ is int:
                value = float(raw)
                if value != value or value in (math.inf, -math.inf):
                    continue
            else:
                number = _number(raw)
                if number is None:
                    continue
                value = number
            steps.append(step)
            times.append(at)
            names.append(name)
            values.append(value)
    return pa.table(
        {
            "run_id": pa.array([run_id] * len(steps), pa.string()),
            "step": pa.array(steps, pa.int64()),
            "time": pa.array(times, pa.float64()),
            "name": pa.array(names, pa.string()),
            "value": pa.array(values, pa.float64()),
        }
    )


def message_text(value: Any) -> str:
    """A prompt or a message list as plain text (``role: content`` per message)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for message in value:
            if isinstance(message, dict):
                content = message.get("content")
                content_text = content if isinstance(content, str) else _dumps(content) if content is not None else ""
                parts.append(f"{message.get('role', '?')}: {content_text}")
            else:
                parts.append(str(message))
        return "\n".join(parts)
    return _dumps(value)


def tool_text(messages: Any) -> str:
    """The content of the tool (and environment) messages of a rollout: what search finds as tool output."""
    if not isinstance(messages, list):
        return ""
    parts = []
    for message in messages:
        if isinstance(message, dict) and message.get("role") in ("tool", "environment", "env", "ipython"):
            content = message.get("content")
            parts.append(content if isinstance(content, str) else _dumps(content))
        if isinstance(message, dict) and message.get("tool_calls"):
            parts.append(_dumps(message["tool_calls"]))
    return "\n".join(parts)


def infra_values(record: Record) -> Iterator[tuple[str, float]]:
    """(name, value) of each numeric field of an ``infra.*`` sample (not its lane, not a boolean)."""
    for name, value in record.items():
        if name in EVENT_COLUMNS or name in LANE_FIELDS or isinstance(value, bool):
            continue
        number = _number(value)
        if number is not None:
            yield name, number


def system_metrics_table(
    run_id: str,
    times: Sequence[float | None],
    kinds: Sequence[str | None],
    sources: Sequence[str | None],
    names: Sequence[str],
    values: Sequence[float],
) -> pa.Table:
    """Rows of the ``system_metrics`` table, in its column order."""
    return pa.table(
        {
            "run_id": pa.array([run_id] * len(names), pa.string()),
            "time": pa.array(times, pa.float64()),
            "kind": pa.array(kinds, pa.string()),
            "source": pa.array(sources, pa.string()),
            "name": pa.array(names, pa.string()),
            "value": pa.array(values, pa.float64()),
        }
    )


def eval_columns(run_id: str, first_seq: int, records: Sequence[Record]) -> pa.Table:
    """Long rows: one per numeric metric of each eval record."""
    rows: dict[str, list[Any]] = {k: [] for k in ("run_id", "seq", "name", "step", "time", "phase", "metric", "value")}
    for offset, record in enumerate(records):
        metrics = record.get("metrics")
        if not isinstance(metrics, dict):
            continue
        for metric, raw in metrics.items():
            value = _number(raw)
            if value is None:
                continue
            rows["run_id"].append(run_id)
            rows["seq"].append(first_seq + offset)
            rows["name"].append(_text(record.get("name")))
            rows["step"].append(_integer(record.get("step")))
            rows["time"].append(_number(record.get("time")))
            rows["phase"].append(_text(record.get("phase")))
            rows["metric"].append(str(metric))
            rows["value"].append(value)
    return pa.table(
        {
            "run_id": pa.array(rows["run_id"], pa.string()),
            "seq": pa.array(rows["seq"], pa.int64()),
            "name": pa.array(rows["name"], pa.string()),
            "step": pa.array(rows["step"], pa.int64()),
            "time": pa.array(rows["time"], pa.float64()),
            "phase": pa.array(rows["phase"], pa.string()),
            "metric": pa.array(rows["metric"], pa.string()),
            "value": pa.array(rows["value"], pa.float64()),
        }
    )


#: ``2026-11-23 16:39:47,279 INFO telescope.run.workers: message`` (Python logging's default-ish format).
LOG_LINE = re.compile(
    r"^(?P<date>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(?:[,.](?P<ms>\d{1,6}))?\s+"
    r"(?:\[?(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\]?)\s+(?:(?P<logger>[\w.\-]+):\s)?(?P<message>.*)$"
)
_LEVEL_NAMES = {"WARN": "WARNING", "FATAL": "CRITICAL"}


def parse_log_line(line: str, previous_time: float | None) -> tuple[float | None, str | None, str | None, str]:
    """(time, level, logger, message) of one log line; a line without the prefix keeps the previous time."""
    if "\r" in line:  # a progress bar redrawn in place: keep what a terminal would show last
        shown = [part for part in line.split("\r") if part.strip()]
        line = shown[-1] if shown else ""
    match = LOG_LINE.match(line)
    if match is None:
        return previous_time, None, None, line
    try:
        at = time.mktime(time.strptime(match["date"].replace("T", " "), "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        at = previous_time or 0.0
    if match["ms"]:
        at += int(match["ms"]) / 10 ** len(match["ms"])
    level = _LEVEL_NAMES.get(match["level"], match["level"])
    return at, level, match["logger"], match["message"]


def log_columns(
    run_id: str, file: str, component: str, first_line: int, lines: Sequence[str], previous_time: float | None
) -> tuple[pa.Table, float | None]:
    """Rows of the ``logs`` table for consecutive lines of one file, and the last time seen."""
    times: list[float | None] = []
    levels: list[str | None] = []
    loggers: list[str | None] = []
    messages: list[str] = []
    last_level: str | None = None
    for line in lines:
        at, level, logger, message = parse_log_line(line, previous_time)
        previous_time = at
        if level is None:
            level = last_level  # a traceback or continuation line belongs to the record above
        else:
            last_level = level
        times.append(at)
        levels.append(level)
        loggers.append(logger)
        messages.append(message)
    count = len(lines)
    table = pa.table(
        {
            "run_id": pa.array([run_id] * count, pa.string()),
            "file": pa.array([file] * count, pa.string()),
            "component": pa.array([component] * count, pa.string()),
            "line_no": pa.array(range(first_line, first_line + count), pa.int64()),
            "time": pa.array(times, pa.float64()),
            "level": pa.array(levels, pa.string()),
            "logger": pa.array(loggers, pa.string()),
            "message": pa.array(messages, pa.string()),
        }
    )
    return table, previous_time
