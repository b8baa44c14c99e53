"""One line per run directory: what ``telescope runs`` lists.

:func:`find_runs` finds the run directories under a folder: the folder itself when it is a
run, else its children that are runs (one level down, as ``runs/<name>/`` is laid out).
:func:`summarize_run` reads one with :class:`~telescope.recording.run_reader.RunReader`:

- ``status``: :func:`~telescope.recording.run_liveness.run_state`'s, so a run whose process
  is gone without recording its end reads ``died``, not ``running``;
- ``step``: the steps done (``status.json``'s ``step``), ``total_steps`` the config's
  ``number_of_steps``;
- ``start_time`` / ``end_time`` (UNIX seconds) from ``status.json``; ``duration_s`` runs to
  the end, or to the last status update while the run has not ended;
- ``value``: the last value of the chosen metric among the current attempt's rows (rows a
  resume went back on are left out), ``None`` when no row has it.

Limits: every call reads the whole ``metrics.jsonl`` of each run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from telescope.recording.run_liveness import run_state
from telescope.recording.run_reader import RunReader

#: The metric ``telescope runs`` shows unless told otherwise (written each step by the recorder).
DEFAULT_METRIC = "reward/mean"


@dataclass(frozen=True)
class RunSummary:
    """What a listing shows of one run (see the module docstring for each field)."""

    name: str
    path: str
    status: str
    status_detail: str | None
    step: int | None
    total_steps: int | None
    start_time: float | None
    end_time: float | None
    duration_s: float | None
    metric: str
    value: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_runs(folder: Path) -> list[Path]:
    """``folder`` when it is a run directory, else its child run directories, sorted by name."""
    if RunReader(folder).exists():
        return [folder]
    return sorted(child for child in folder.iterdir() if child.is_dir() and RunReader(child).exists())


def summarize_run(run_dir: Path, metric: str = DEFAULT_METRIC) -> tuple[RunSummary, set[str]]:
    """The run's summary and the names of every metric its current rows hold."""
    reader = RunReader(run_dir)
    status = reader.status() or {}
    state = run_state(status or None)
    config = reader.config() or {}
    latest = reader.latest_metrics()
    rows = [latest[step] for step in sorted(latest)]
    names = {key for row in rows for key in row}
    value = next((row[metric] for row in reversed(rows) if isinstance(row.get(metric), (int, float))), None)
    start, end = _number(status.get("start_time")), _number(status.get("end_time"))
    last = end if end is not None else _number(status.get("updated_time"))
    summary = RunSummary(
        name=run_dir.name,
        path=str(run_dir),
        status=state.status,
        status_detail=state.detail,
        step=_integer(status.get("step")),
        total_steps=_integer(config.get("number_of_steps")),
        start_time=start,
        end_time=end,
        duration_s=last - start if start is not None and last is not None else None,
        metric=metric,
        value=float(value) if value is not None else None,
    )
    return summary, names


def summarize_runs(run_dirs: Iterable[Path], metric: str = DEFAULT_METRIC) -> tuple[list[RunSummary], set[str]]:
    """Summaries of ``run_dirs`` (oldest start first) and every metric name any of them holds."""
    summaries: list[RunSummary] = []
    names: set[str] = set()
    for run_dir in run_dirs:
        summary, held = summarize_run(run_dir, metric)
        summaries.append(summary)
        names |= held
    summaries.sort(key=lambda s: (s.start_time is None, s.start_time or 0.0, s.name))
    return summaries, names - {"step", "time", "attempt"}


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _integer(value: object) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None
