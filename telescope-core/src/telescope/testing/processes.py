"""Live processes of a run, found by their command line: for end-to-end tests of runs.

A run's processes (Ray workers, inference servers) carry the run directory in their
command lines. :func:`processes_mentioning` lists the live processes whose command line
holds a text, leaving out the calling process and its ancestors (the test runner, whose
own command line may name the same path). Leaving out every command line that merely
contains "pytest" would be wrong: pytest's temporary directories are named
``pytest-of-<user>``, so every process of a run placed there would be left out and a
check for leftovers could never fail.

Linux only (reads ``/proc``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["leftovers_after", "pid_of", "processes_mentioning"]


def _ancestors() -> set[int]:
    """This process and its ancestors, up to init."""
    pids = {os.getpid()}
    pid = os.getpid()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the command name is the state, then ppid
        pids.add(pid)
    return pids


def processes_mentioning(text: str) -> list[str]:
    """``"PID: command line"`` of each live process whose command line holds ``text``.

    This process and its ancestors are left out.
    """
    mine = _ancestors()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in mine:
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if cmdline and text in cmdline:
            found.append(f"{proc.name}: {cmdline}")
    return found


def pid_of(text: str, marker: str) -> int:
    """The process whose command line holds both ``text`` (say, a run directory) and ``marker``."""
    for line in processes_mentioning(text):
        if marker in line:
            return int(line.split(":", 1)[0])
    raise LookupError(f"no live process whose command line holds {marker!r} and {text!r}")


def leftovers_after(text: str, timeout_s: float = 30.0) -> list[str]:
    """:func:`processes_mentioning` once they are gone, or what is still there after ``timeout_s``.

    A run's processes stop in a chain (a Ray worker stops, then its server dies with it
    through ``PR_SET_PDEATHSIG``), which can take some seconds after the driver exits.
    """
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        found = processes_mentioning(text)
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.5)
