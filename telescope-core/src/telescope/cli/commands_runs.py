"""``telescope runs [DIR ...]``: the runs under folders, one line each (or ``--json``).

Each DIR (default ``runs``) is a run directory or a folder of them (one level down). A
line shows the run's name, status (``died`` for a run whose process is gone without
recording its end), steps done out of ``number_of_steps``, start, end (``-`` while it has
not ended), duration, and the last value of ``--metric`` in the current attempt.

Exit codes: 0 with at least one run listed; 1 when the folders hold no run; 2 for a DIR
that does not exist or a ``--metric`` that no run with metrics has ever recorded.
"""

from __future__ import annotations

import difflib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from telescope.cli.main import EXIT_FAILURE, UserError

if TYPE_CHECKING:
    from telescope.recording.run_summary import RunSummary

DEFAULT_DIR = Path("runs")


@click.command(name="runs")
@click.argument("dirs", nargs=-1, type=click.Path(path_type=Path))
@click.option("--metric", default=None, help="Metric whose last value is shown (default: reward/mean).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def runs_command(dirs: tuple[Path, ...], metric: str | None, as_json: bool) -> int:
    """List the runs under DIR (default: runs/): status, step, start, end and a metric's last value."""
    from telescope.recording.run_summary import DEFAULT_METRIC, find_runs, summarize_runs

    folders = list(dirs) or [DEFAULT_DIR]
    run_dirs: list[Path] = []
    for folder in folders:
        if not folder.is_dir():
            what = "is not a folder" if folder.exists() else "does not exist"
            raise UserError(f"{folder} {what}; give a run directory or a folder of runs (default: runs/)")
        run_dirs += find_runs(folder)
    if not run_dirs:
        click.echo(
            f"no runs under {', '.join(str(f) for f in folders)} "
            "(a run directory holds status.json or metrics.jsonl; `telescope run CONFIG` writes runs/<name>/)",
            err=True,
        )
        return EXIT_FAILURE
    chosen = metric or DEFAULT_METRIC
    summaries, names = summarize_runs(run_dirs, chosen)
    if metric is not None and names and chosen not in names:
        close = difflib.get_close_matches(chosen, sorted(names), n=3)
        shown = close or sorted(names)[:8]
        hint = f"did you mean {', '.join(shown)}?" if close else f"recorded metrics include {', '.join(shown)}"
        raise UserError(f"no run recorded the metric {chosen!r}; {hint}")
    if as_json:
        click.echo(json.dumps([s.as_dict() for s in summaries], indent=2))
    else:
        _print_table(summaries, chosen)
    return 0


def _print_table(summaries: list[RunSummary], metric: str) -> None:
    headers = ("NAME", "STATUS", "STEP", "START", "END", "DURATION", metric)
    rows = [
        (
            s.name,
            s.status,
            f"{_or_dash(s.step)}/{_or_dash(s.total_steps)}",
            _clock(s.start_time),
            _clock(s.end_time),
            _duration(s.duration_s),
            "-" if s.value is None else f"{s.value:.4g}",
        )
        for s in summaries
    ]
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    for line in (headers, *rows):
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _clock(seconds: float | None) -> str:
    return "-" if seconds is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
