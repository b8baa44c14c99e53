"""Turn run-store records into the columns of the DuckDB tables (see :mod:`.schema`).

Each ``*_columns`` function takes a batch of records and returns a ``pyarrow.Table`` in
the column order of its table, built column-wise so a batch of a million records costs
one pass in Python and one bulk insert. Unknown or malformed fields never raise: a
record missing ``step`` is dropped from ``metrics``, a non-numeric metric is not a
metric, a field of an unexpected type becomes NULL.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

Record = dict[str, Any]

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode

#: Event fields stored in their own columns (the rest goes to ``fields_json``).
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
            if name == "step" or name == "time":
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


ROLLOUT_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("seq", pa.int64()),
        ("step", pa.int64()),
        ("group_index", pa.int64()),
        ("rollout_index", pa.int64()),
        ("sample_id", pa.string()),
        ("environment", pa.string()),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("stop_reason", pa.string()),
        ("num_turns", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("total_tokens", pa.int64()),
        ("policy_version", pa.int64()),
        ("error", pa.string()),
        ("discard_reason", pa.string()),
        ("prompt_text", pa.string()),
        ("completion", pa.string()),
        ("tool_text", pa.string()),
        ("sample_metrics_json", pa.string()),
        ("record_json", pa.string()),
    ]
)


def rollout_columns(run_id: str, first_seq: int, records: Sequence[Record]) -> pa.Table:
    """One row per rollout record; ``seq`` numbers them in stream order from ``first_seq``."""
    columns: dict[str, list[Any]] = {field.name: [] for field in ROLLOUT_SCHEMA}
    for offset, record in enumerate(records):
        columns["run_id"].append(run_id)
        columns["seq"].append(first_seq + offset)
        for name in ("step", "group_index", "rollout_index", "num_turns", "prompt_tokens", "completion_tokens"):
            columns[name].append(_integer(record.get(name)))
        columns["total_tokens"].append(_integer(record.get("total_tokens")))
        columns["policy_version"].append(_integer(record.get("policy_version")))
        columns["sample_id"].append(_text(record.get("sample_id")))
        columns["environment"].append(_text(record.get("environment")))
        columns["reward"].append(_number(record.get("reward")))
        columns["advantage"].append(_number(record.get("advantage")))
        columns["stop_reason"].append(_text(record.get("stop_reason")))
        columns["error"].append(_text(record.get("error")))
        discard = record.get("discard_reason")
        if discard is None and record.get("discarded") is True:
            discard = "discarded"
        columns["discard_reason"].append(_text(discard))
        columns["prompt_text"].append(message_text(record.get("prompt")))
        columns["completion"].append(message_text(record.get("completion")))
        columns["tool_text"].append(tool_text(record.get("messages")))
        sample_metrics = record.get("sample_metrics")
        columns["sample_metrics_json"].append(_dumps(sample_metrics) if isinstance(sample_metrics, dict) else "{}")
        columns["record_json"].append(_dumps(record))
    return pa.table(columns, schema=ROLLOUT_SCHEMA)


EVENT_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("seq", pa.int64()),
        ("kind", pa.string()),
        ("component", pa.string()),
        ("start", pa.float64()),
        ("duration", pa.float64()),
        ("step", pa.int64()),
        ("lane", pa.string()),
        ("sandbox_id", pa.string()),
        ("error", pa.string()),
        ("fields_json", pa.string()),
    ]
)


def event_component(record: Record) -> str:
    """The component of an event: its ``component`` field, else the first part of its kind."""
    component = record.get("component")
    if isinstance(component, str) and component:
        return component
    kind = str(record.get("kind") or "other")
    return kind.split(".", 1)[0]


def event_lane(record: Record) -> str:
    """The lane of an event inside its component (server, rank, sandbox, ...; ``main`` if none)."""
    for field in LANE_FIELDS:
        value = record.get(field)
        if value is not None and not isinstance(value, (dict, list)):
            return f"{field} {value}"
    return "main"


def event_columns(run_id: str, first_seq: int, records: Sequence[Record]) -> tuple[pa.Table, pa.Table]:
    """(events rows, system_metrics rows): every event, and the numeric fields of ``infra.*`` events."""
    columns: dict[str, list[Any]] = {field.name: [] for field in EVENT_SCHEMA}
    sm_time: list[float] = []
    sm_kind: list[str] = []
    sm_source: list[str] = []
    sm_name: list[str] = []
    sm_value: list[float] = []
    for offset, record in enumerate(records):
        kind = _text(record.get("kind"))
        start = _number(record.get("start"))
        lane = event_lane(record)
        columns["run_id"].append(run_id)
        columns["seq"].append(first_seq + offset)
        columns["kind"].append(kind)
        columns["component"].append(event_component(record))
        columns["start"].append(start)
        columns["duration"].append(_number(record.get("duration_s")) or 0.0)
        columns["step"].append(_integer(record.get("step")))
        columns["lane"].append(lane)
        columns["sandbox_id"].append(_text(record.get("sandbox_id")))
        columns["error"].append(_text(record.get("error")))
        rest = {k: v for k, v in record.items() if k not in EVENT_COLUMNS}
        columns["fields_json"].append(_dumps(rest) if rest else "{}")
        if kind is not None and kind.startswith("infra.") and start is not None:
            for name, value in rest.items():
                number = _number(value)
                if number is None or name in LANE_FIELDS or isinstance(value, bool):
                    continue
                sm_time.append(start)
                sm_kind.append(kind)
                sm_source.append(lane)
                sm_name.append(name)
                sm_value.append(number)
    events = pa.table(columns, schema=EVENT_SCHEMA)
    system = pa.table(
        {
            "run_id": pa.array([run_id] * len(sm_time), pa.string()),
            "time": pa.array(sm_time, pa.float64()),
            "kind": pa.array(sm_kind, pa.string()),
            "source": pa.array(sm_source, pa.string()),
            "name": pa.array(sm_name, pa.string()),
            "value": pa.array(sm_value, pa.float64()),
        }
    )
    return events, system


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
