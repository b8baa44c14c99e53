"""W&B runs as a second source: runs written by Telescope's W&B logger
(:mod:`telescope.recording.wandb_logger`), read from W&B's own run files or its public API.

- **Files** (no key, no network): a W&B run folder (``offline-run-*`` or ``run-*``, with
  ``run-<id>.wandb``) under a served folder, or under its ``wandb/``. The ``.wandb`` file
  is W&B's transaction log: LevelDB's log format (blocks of 32 KiB holding records, each
  with a CRC-32 checksum, a length and a type: whole, or first, middle or last part of a
  record split across blocks) after a 7-byte header (``:W&B``, 0xBEE1, version 0); each
  record is a protobuf ``Record`` of ``wandb.proto.wandb_internal_pb2``. wandb 0.2x's
  Python reader of it is gone (its core is in Go now), so :class:`TransactionLog` reads it
  here: from a byte offset, whole records only, so the log of a live run is read as it
  grows, like the run store's files. A W&B folder inside a Telescope run directory is left
  out: that run's own files say more.
- **API** (``telescope ui --wandb-project ENTITY/PROJECT``, when wandb is installed and a
  key is configured): the project's runs tagged ``telescope``, through ``wandb.Api()``:
  their config, state and history (``scan_history`` from the last step synced), at most
  every :data:`API_INTERVAL_S` seconds.

What a W&B run gives (what the logger sends): the config; the step metrics (history rows;
keys starting with ``_`` are W&B's own); evals (``eval/<name>/<metric>``, at the step
``eval/<name>/step`` of the same row); from the files also the rollout and event tables
(``rollouts_table``, ``events_table*``: the table JSON under ``files/``), as rollouts and
timeline events; the status (``running`` until the run's exit record or state says how it
ended). Not logs or code (the logger uploads them as an artifact and through
``log_code``), nor W&B's system metrics.

Limits: rollouts in W&B tables hold the logger's columns only (texts cut at its
``max_text_chars``), and at most ``max_table_rows`` a step. The API source reads no
tables (they are artifacts, a download each).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import struct
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from telescope.recording.block_format import EVENTS_SCHEMA, ROLLOUTS_SCHEMA
from telescope_ui_sync.sync import ingest
from telescope_ui_sync.sync import records as rec
from telescope_ui_sync.sync.base import PassResult, Syncer

log = logging.getLogger(__name__)

HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
BLOCK = 32 * 1024
RECORD_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
#: Seconds between two looks at a run through the W&B API.
API_INTERVAL_S = 5.0
_FOLDER = re.compile(r"^(offline-)?run-.*$")


def _checksums() -> dict[int, int]:
    return {kind: zlib.crc32(bytes([kind])) for kind in (FULL, FIRST, MIDDLE, LAST)}


_TYPE_CRC = _checksums()


class TransactionLog:
    """Reads the records of a ``.wandb`` file from a byte offset (see the module docstring)."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset

    def read(self) -> list[bytes]:
        """The whole records after the offset; a record not yet whole waits for the next call."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        if len(data) < len(HEADER):
            return []
        if data[: len(HEADER)] != HEADER:
            raise ValueError(f"{self.path} is not a W&B transaction log")
        position = max(self.offset, len(HEADER))
        out: list[bytes] = []
        parts: list[bytes] = []
        start = position  # where the record being assembled began
        while True:
            left = BLOCK - position % BLOCK
            if left < RECORD_HEADER:  # a block's tail too short for a header is padding
                position += left
                continue
            if position + RECORD_HEADER > len(data):
                break
            checksum, length, kind = struct.unpack_from("<IHB", data, position)
            end = position + RECORD_HEADER + length
            if end > len(data) or kind not in _TYPE_CRC:
                break  # being written
            payload = data[position + RECORD_HEADER : end]
            if zlib.crc32(payload, _TYPE_CRC[kind]) & 0xFFFFFFFF != checksum:
                break  # being written (or damaged): wait
            position = end
            if kind == FULL:
                out.append(payload)
                start = position
            elif kind == FIRST:
                parts = [payload]
            elif kind == MIDDLE:
                parts.append(payload)
            else:
                out.append(b"".join([*parts, payload]))
                parts = []
                start = position
        self.offset = start
        return out


def is_wandb_run_folder(path: Path) -> bool:
    return _FOLDER.match(path.name) is not None and path.is_dir() and any(path.glob("run-*.wandb"))


def discover_wandb(roots: Iterable[Path], is_run_dir: Any) -> list[tuple[Path, Path]]:
    """(W&B run folder, root) under ``roots``: a root that is one, its children, or its
    ``wandb/`` folder's; not those of a Telescope run directory (``is_run_dir``)."""
    found: list[tuple[Path, Path]] = []
    for root in roots:
        if is_wandb_run_folder(root):
            found.append((root, root))
            continue
        if is_run_dir(root):
            continue
        for folder in (root, root / "wandb"):
            try:
                children = sorted(folder.iterdir())
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                continue
            found.extend((child, root) for child in children if is_wandb_run_folder(child))
    return found


# ----------------------------------------------------------------- what a run gives


@dataclass
class RunUpdate:
    """What was read of a W&B run since the last pass."""

    name: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    start_time: float | None = None
    status: str | None = None
    end_time: float | None = None
    rows: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (step, history row)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _config(items: Iterable[Any]) -> dict[str, Any]:
    config = {}
    for item in items:
        key = item.key or "/".join(item.nested_key)
        if key and not key.startswith("_"):
            value = _json(item.value_json)
            wrapped = isinstance(value, dict) and set(value) <= {"value", "desc"}  # W&B's {"value": ...} form
            config[key] = value.get("value") if wrapped else value
    return config


def parse_records(payloads: Iterable[bytes], update: RunUpdate) -> RunUpdate:
    """Fold the protobuf records of a transaction log into ``update``."""
    from wandb.proto import wandb_internal_pb2  # optional: only with W&B runs to read

    for payload in payloads:
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        try:
            record.ParseFromString(payload)
        except Exception:  # a record of a newer wandb: skip it
            continue
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            update.name = run.display_name or run.run_id or update.name
            update.config.update(_config(run.config.update))
            if run.start_time.seconds:
                update.start_time = run.start_time.seconds + run.start_time.nanos / 1e9
            update.status = update.status or "running"
        elif kind == "config":
            update.config.update(_config(record.config.update))
        elif kind == "history":
            row: dict[str, Any] = {}
            for item in record.history.item:
                path = [item.key] if item.key else list(item.nested_key)
                if not path:
                    continue
                target = row
                for part in path[:-1]:
                    target = target.setdefault(part, {})
                target[path[-1]] = _json(item.value_json)
            step = row.get("_step", record.history.step.num)
            update.rows.append((int(step) if _number(step) is not None else record.history.step.num, row))
        elif kind == "exit":
            update.status = "completed" if record.exit.exit_code == 0 else "failed"
            update.end_time = time.time()
    return update


# -------------------------------------------------------------------------- syncers


def _run_id(prefix: str, key: str, name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:80] or "run"
    return f"{safe}-{prefix}{hashlib.sha1(key.encode()).hexdigest()[:6]}"


class WandbSyncer(Syncer):
    """Writes a W&B run's updates: its row, metrics, evals and (from files) rollouts and events."""

    source = "wandb"

    def write(self, update: RunUpdate, files: Path | None, position: dict[str, Any]) -> dict[str, int]:
        config = {**position.get("config", {}), **update.config}
        position["config"] = config
        rows = {"metrics": 0, "evals": 0, "rollouts": 0, "events": 0}
        with self._transaction():
            self.con.execute(
                "UPDATE runs SET name = coalesce(?, name), status = coalesce(?, status), "
                "start_time = coalesce(?, start_time), end_time = coalesce(?, end_time), config_json = ?, "
                "number_of_steps = ?, step = coalesce(?, step), updated_time = ?, last_sync = ? WHERE run_id = ?",
                [
                    update.name,
                    update.status,
                    update.start_time,
                    update.end_time,
                    json.dumps(config),
                    rec._integer(config.get("number_of_steps")),
                    max((s for s, _ in update.rows), default=None),
                    time.time(),
                    time.time(),
                    self.run_id,
                ],
            )
            if update.rows:
                rows.update(self._history(update.rows, files, position))
            self._save_cursor("wandb", position)
        return rows

    def _history(
        self, history: Sequence[tuple[int, dict[str, Any]]], files: Path | None, position: dict[str, Any]
    ) -> dict[str, int]:
        metrics: list[dict[str, Any]] = []
        evals: list[dict[str, Any]] = []
        rollouts: list[str] = []
        events: list[str] = []
        for step, row in history:
            values: dict[str, Any] = {"step": step, "time": row.get("_timestamp")}
            for key, value in row.items():
                if key.startswith("_"):
                    continue
                if isinstance(value, dict) and value.get("_type") == "table-file" and files is not None:
                    table = _read_table(files / str(value.get("path", "")))
                    if key == "rollouts_table":
                        rollouts.extend(json.dumps(dict(zip(table[0], r, strict=False))) for r in table[1])
                    elif key.startswith("events_table"):
                        events.extend(json.dumps(_event(table[0], r)) for r in table[1])
                elif key.startswith("eval/") and key.count("/") >= 2 and not key.endswith("/step"):
                    name = key.split("/")[1]
                    eval_step = row.get(f"eval/{name}/step", step)
                    if _number(value) is not None:
                        evals.append(
                            {"name": name, "step": eval_step, "time": row.get("_timestamp"), "metrics": {key: value}}
                        )
                else:
                    values[key] = value
            metrics.append(values)
        table = rec.metrics_columns(self.run_id, metrics)
        ingest.replace_steps(self.con, self.run_id, table)
        first = position.get("next_eval", 0)
        ingest.append(self.con, "evals", rec.eval_columns(self.run_id, first, evals))
        position["next_eval"] = first + len(evals)
        for name, lines, schema in (("rollouts", rollouts, ROLLOUTS_SCHEMA), ("events", events, EVENTS_SCHEMA)):
            if not lines:
                continue
            arrow = schema.table_from_lines(("\n".join(lines) + "\n").encode("utf-8"))
            source = ingest.table_source(self.con, arrow)
            try:
                insert = ingest.insert_rollouts if name == "rollouts" else ingest.insert_events
                insert(self.con, self.run_id, source, position.get(f"next_{name}", 0))
            finally:
                self.con.unregister(source.sql)
            position[f"next_{name}"] = position.get(f"next_{name}", 0) + arrow.num_rows
        return {"metrics": len(metrics), "evals": len(evals), "rollouts": len(rollouts), "events": len(events)}


class WandbFolderSyncer(WandbSyncer):
    """A W&B run folder (offline, or an online run's local copy): its transaction log, read as it grows."""

    def __init__(self, con: duckdb.DuckDBPyConnection, folder: Path, root: Path) -> None:
        super().__init__(
            con, _run_id("wandb-", str(folder.resolve()), folder.name), folder.name, str(folder), str(root)
        )
        self.folder = folder
        self.position = self.saved_positions().get("wandb", {})
        logs = sorted(folder.glob("run-*.wandb"))
        self.log = TransactionLog(logs[0], int(self.position.get("offset", 0))) if logs else None

    def sync_once(self) -> PassResult:
        result = PassResult()
        if not self.folder.is_dir():
            self._set_missing(True, f"W&B run folder {self.folder}")
            result.missing = True
            return result
        self._set_missing(False)
        if self.log is None:
            return result
        payloads = self.log.read()
        if not payloads:
            return result
        update = parse_records(payloads, RunUpdate())
        self.position["offset"] = self.log.offset
        result.rows = self.write(update, self.folder / "files", self.position)
        return result


class WandbApiSyncer(WandbSyncer):
    """A run of the W&B API: its config, state and the history after the last step synced."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run: Any, project: str) -> None:
        path = f"{project}/{getattr(run, 'id', '')}"
        super().__init__(
            con,
            _run_id("wandb-", path, str(getattr(run, "name", "") or run.id)),
            str(getattr(run, "name", "") or run.id),
            f"wandb:{path}",
            f"wandb:{project}",
        )
        self.run = run
        self.position = self.saved_positions().get("wandb", {})
        self.last_look = 0.0

    def sync_once(self) -> PassResult:
        result = PassResult()
        if time.monotonic() - self.last_look < API_INTERVAL_S:
            return result
        self.last_look = time.monotonic()
        try:
            update = api_update(self.run, int(self.position.get("next_step", 0)))
        except Exception as exc:  # the network: next time
            log.warning("reading W&B run %s failed: %s", self.run_id, exc)
            return result
        if update.rows:
            self.position["next_step"] = max(step for step, _ in update.rows) + 1
        result.rows = self.write(update, None, self.position)
        return result


def _read_table(path: Path) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows) of a W&B table file; empty when it is missing or not a table."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return [], []
    columns, rows = data.get("columns"), data.get("data")
    return (columns, rows) if isinstance(columns, list) and isinstance(rows, list) else ([], [])


def _event(columns: list[str], row: list[Any]) -> dict[str, Any]:
    """An event back from a row of the logger's events table (its ``fields`` cell is the rest)."""
    event = {k: v for k, v in zip(columns, row, strict=False) if k != "fields" and v is not None}
    fields = dict(zip(columns, row, strict=False)).get("fields")
    extra = _json(fields) if isinstance(fields, str) else None
    return {**event, **(extra if isinstance(extra, dict) else {})}


def wandb_available() -> bool:
    try:
        from wandb.proto import wandb_internal_pb2  # noqa: F401
    except ImportError:
        return False
    return True


def api_runs(api: Any, projects: Sequence[str]) -> Iterator[tuple[Any, str]]:
    """(run, project) for the runs tagged ``telescope`` of ``projects`` in the W&B API ``api``."""
    for project in projects:
        try:
            yield from ((run, project) for run in api.runs(project, filters={"tags": {"$in": ["telescope"]}}))
        except Exception as exc:  # the network, a project that does not exist: next pass
            log.warning("listing the W&B runs of %s failed: %s", project, exc)


API_STATES = {
    "running": "running",
    "finished": "completed",
    "failed": "failed",
    "crashed": "failed",
    "killed": "interrupted",
}


def api_update(run: Any, min_step: int) -> RunUpdate:
    """What a W&B API run gives from ``min_step`` on (see the module docstring)."""
    state = str(getattr(run, "state", "") or "")
    update = RunUpdate(
        name=getattr(run, "name", None) or getattr(run, "id", None),
        config={k: v for k, v in dict(getattr(run, "config", {}) or {}).items() if not str(k).startswith("_")},
        status=API_STATES.get(state),
    )
    for row in run.scan_history(min_step=min_step):
        step = row.get("_step")
        if _number(step) is not None:
            update.rows.append((int(step), dict(row)))
    return update
