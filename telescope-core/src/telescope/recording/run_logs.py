"""Logs in the run directory: a worker process's logging and stdout/stderr, and the sandboxes' log.

:func:`capture_process_logs` (called by each trainer rank) writes

- ``logs/<name>.log``: log records at INFO and above (``main_level``: the
  orchestrator's is DEBUG with ``debug: true``);
- ``logs/detailed/<name>.log``: log records at DEBUG and above (Telescope's own
  loggers are set to DEBUG; other libraries keep their level);
- ``logs/stdout/<name>.log``: the process's console, every line it prints to
  ``sys.stdout`` / ``sys.stderr`` (the streams are teed: what Ray forwards to the
  driver with ``ray_log_to_driver`` still goes there). ``tee_streams=False`` leaves
  the streams alone, for a process whose console its parent already writes there
  (the embedded inference server).

The three kinds are what ``wandb_upload_logs``, ``wandb_upload_logs_detailed`` and
``wandb_upload_logs_stdout`` select.

When the root logger had no handler (a fresh Ray worker), a WARNING handler on the
original stderr is added too, so warnings still reach the driver as they did before
(Python's last-resort handler stops once any handler exists). A record logged with
``extra={"console": False}`` skips it: the launcher's full tracebacks, whose one-line
summary it prints itself.

:class:`SandboxLog` is an event sink (the run subscribes it) that writes every
``sandbox.*`` event as readable lines to ``logs/sandboxes.log``: time, kind, sandbox
and sample ids, duration, exit code or error, the command, then the output
excerpts, indented. The file is created with the first sandbox event.

Limits: output written below Python (C extensions writing to file descriptor 1 or 2,
NCCL's own logging) is not teed; it stays in Ray's worker logs.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from telescope.recording.jsonl import AppendOnlyTextFile

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TeeStream:
    """A text stream that writes to ``primary`` and copies every write to ``copy``."""

    def __init__(self, primary: IO[str], copy: IO[str]) -> None:
        self.primary = primary
        self.copy = copy
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        written = self.primary.write(text)
        with self._lock, contextlib.suppress(ValueError, OSError):  # a closed copy never breaks printing
            self.copy.write(text)
            self.copy.flush()
        return written

    def flush(self) -> None:
        self.primary.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, ... of the real stream
        return getattr(self.primary, name)


def capture_process_logs(
    run_dir: Path | str, name: str, *, tee_streams: bool = True, main_level: int = logging.INFO
) -> Callable[[], None]:
    """Send this process's logging and console to ``<run_dir>/logs/`` (see the module docstring).

    Returns the function that undoes it (handlers removed, streams restored, files closed).
    """
    logs = Path(run_dir) / "logs"
    (logs / "detailed").mkdir(parents=True, exist_ok=True)
    (logs / "stdout").mkdir(exist_ok=True)
    formatter = logging.Formatter(FORMAT)
    main = logging.FileHandler(logs / f"{name}.log", encoding="utf-8")
    main.setLevel(main_level)
    detailed = logging.FileHandler(logs / "detailed" / f"{name}.log", encoding="utf-8")
    detailed.setLevel(logging.DEBUG)
    root = logging.getLogger()
    handlers: list[logging.Handler] = [main, detailed]
    if not root.handlers:
        warnings = logging.StreamHandler(sys.stderr)
        warnings.setLevel(logging.WARNING)
        warnings.addFilter(lambda record: getattr(record, "console", True))  # extra={"console": False}: files only
        handlers.append(warnings)
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    telescope_logger = logging.getLogger("telescope")
    previous_level = telescope_logger.level
    telescope_logger.setLevel(logging.DEBUG)
    previous_streams = sys.stdout, sys.stderr
    copy: IO[str] | None = None
    if tee_streams:
        copy = (logs / "stdout" / f"{name}.log").open("a", encoding="utf-8")
        sys.stdout = TeeStream(sys.stdout, copy)
        sys.stderr = TeeStream(sys.stderr, copy)

    def undo() -> None:
        sys.stdout, sys.stderr = previous_streams
        telescope_logger.setLevel(previous_level)
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
        if copy is not None:
            copy.close()

    return undo


class SandboxLog:
    """An event sink writing ``sandbox.*`` events to a text file (see the module docstring)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._file = AppendOnlyTextFile(self.path)

    def __call__(self, event: dict[str, Any]) -> None:
        kind = str(event.get("kind", ""))
        if not kind.startswith("sandbox."):
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(event.get("start", 0.0))))
        parts = [stamp, kind, f"sandbox={event.get('sandbox_id', '-')}"]
        for key in ("sample_id", "group_id", "rollout_index", "turn", "exit_code", "timed_out", "path", "bytes"):
            if event.get(key) is not None:
                parts.append(f"{key}={event[key]}")
        parts.append(f"{float(event.get('duration_s', 0.0)):.3f}s")
        if event.get("error"):
            parts.append(f"error={event['error']}")
        lines = [" ".join(parts)]
        if event.get("command"):
            lines.append(f"    $ {event['command']}")
        for stream in ("stdout", "stderr"):
            text = str(event.get(stream) or "").rstrip("\n")
            if text:
                lines.append(f"    [{stream}]")
                lines.extend(f"    {line}" for line in text.splitlines())
        self._file.append("\n".join(lines) + "\n")  # dropped once closed

    def close(self) -> None:
        self._file.close()
