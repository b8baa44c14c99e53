"""Read a run directory, also while its run is still writing it.

:class:`RunReader` reads the files of :mod:`telescope.recording.run_store`. It never locks or
modifies them. A JSON Lines file is read up to its last newline: bytes after it are a line
still being written (or cut short by a crash) and are left out, so a reader never sees a
half record. A complete line that is not a JSON object (a partial line a crash left in the
middle of a file, see :class:`~telescope.recording.run_store.JsonlWriter`) is skipped and
counted in :attr:`JsonlFollower.skipped_lines`.

For a dashboard that polls, :meth:`RunReader.follow` returns a :class:`JsonlFollower`
that remembers its byte offset and returns only the records appended since its last call.

Limits: the plain methods (``metrics()``, ``rollouts()``, ...) read the whole file on each
call; rollouts files of long runs are large, so poll with a follower instead. A file that
is truncated or replaced under a follower is read again from its start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from telescope.recording.run_store import (
    CONFIG_JSON,
    CONFIG_YAML,
    EVALS_FILE,
    EVENTS_FILE,
    METRICS_FILE,
    ROLLOUTS_FILE,
    STATUS_FILE,
)

Record = dict[str, Any]


class JsonlFollower:
    """Incremental reader of one JSON Lines file: each :meth:`read_new` returns new complete records."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.skipped_lines = 0

    def read_new(self) -> list[Record]:
        """Records of the complete lines appended since the last call (empty if none or no file)."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:  # truncated or replaced: start again
            self.offset = 0
        if size == self.offset:
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read(size - self.offset)
        end = data.rfind(b"\n")
        if end < 0:  # only a line still being written
            return []
        self.offset += end + 1
        records: list[Record] = []
        for raw_line in data[: end + 1].splitlines():
            if not raw_line.strip():
                continue
            try:
                value = json.loads(raw_line)
            except ValueError:
                self.skipped_lines += 1
                continue
            if isinstance(value, dict):
                records.append(value)
            else:
                self.skipped_lines += 1
        return records


def read_jsonl(path: Path) -> list[Record]:
    """Every complete record of a JSON Lines file (``[]`` when it does not exist)."""
    return JsonlFollower(path).read_new()


class RunReader:
    """Reads one run directory (see :mod:`telescope.recording.run_store` for the layout)."""

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir)

    def exists(self) -> bool:
        """Whether this looks like a run directory (it has a status or a metrics file)."""
        return (self.run_dir / STATUS_FILE).exists() or (self.run_dir / METRICS_FILE).exists()

    def metrics(self) -> list[Record]:
        """Per-step metric records in file order (a resumed run may repeat steps)."""
        return read_jsonl(self.run_dir / METRICS_FILE)

    def latest_metrics(self) -> dict[int, Record]:
        """The last record of each step (the one a resumed run wrote last wins)."""
        return {int(record["step"]): record for record in self.metrics() if "step" in record}

    def rollouts(self, step: int | None = None) -> list[Record]:
        """Rollout records, all or those of one ``step``."""
        records = read_jsonl(self.run_dir / ROLLOUTS_FILE)
        if step is None:
            return records
        return [record for record in records if record.get("step") == step]

    def events(self, kind: str | None = None) -> list[Record]:
        """Timeline events, all or those whose ``kind`` equals ``kind`` or starts with ``kind + '.'``."""
        records = read_jsonl(self.run_dir / EVENTS_FILE)
        if kind is None:
            return records
        prefix = kind + "."
        return [r for r in records if r.get("kind") == kind or str(r.get("kind", "")).startswith(prefix)]

    def evals(self, name: str | None = None) -> list[Record]:
        """Eval results, all or those of the eval ``name``."""
        records = read_jsonl(self.run_dir / EVALS_FILE)
        if name is None:
            return records
        return [record for record in records if record.get("name") == name]

    def status(self) -> Record | None:
        """The content of status.json, or ``None`` before the run wrote it."""
        return _read_json_object(self.run_dir / STATUS_FILE)

    def config(self) -> Record | None:
        """The resolved config (config.json), or ``None`` before the run wrote it."""
        return _read_json_object(self.run_dir / CONFIG_JSON)

    def config_text(self) -> str | None:
        """The resolved config as YAML text, or ``None`` before the run wrote it."""
        try:
            return (self.run_dir / CONFIG_YAML).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def logs(self) -> list[Path]:
        """Every file under logs/, sorted."""
        logs_dir = self.run_dir / "logs"
        if not logs_dir.is_dir():
            return []
        return sorted(path for path in logs_dir.rglob("*") if path.is_file())

    def follow(self, name: str) -> JsonlFollower:
        """An incremental reader of ``metrics``, ``rollouts``, ``events`` or ``evals``."""
        files = {"metrics": METRICS_FILE, "rollouts": ROLLOUTS_FILE, "events": EVENTS_FILE, "evals": EVALS_FILE}
        if name not in files:
            raise ValueError(f"no stream {name!r} in a run directory; use one of {', '.join(files)}")
        return JsonlFollower(self.run_dir / files[name])


def _read_json_object(path: Path) -> Record | None:
    """A JSON object file written atomically; ``None`` when absent (or not an object)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return value if isinstance(value, dict) else None
