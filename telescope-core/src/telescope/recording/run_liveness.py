"""Whether a run that says ``running`` still runs: what every reader of a run directory shows.

A run writes ``status: running`` and keeps it until it ends; a driver killed by SIGKILL (or
an OOM kill, a machine that went down) never writes its end, so its ``status.json`` says
``running`` forever. :func:`run_state` is what readers (the dashboard, ``telescope runs``)
show instead of the raw field: ``died`` for a run whose recorded process is gone.

The check: ``status.json`` holds the driver's ``pid`` and ``host`` (the hostname) and
``updated_time`` (when that process last wrote it). On the host that wrote it, the run is
dead when no process has that PID, when it is a zombie, or when the process with that PID
started after ``updated_time`` (the PID was reused). psutil does the looking.

Limits: on another host nothing can be checked: the run is shown ``running`` with
``checked`` False (a reader says so rather than guess). Two machines with the same hostname
(containers, say) that do not share their PID namespace cannot tell each other's runs apart.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Seconds of clock slack between a process's start time (psutil) and the times it wrote.
_CLOCK_SLACK_S = 2.0


@dataclass(frozen=True)
class RunState:
    """What a reader shows of a run's status.

    ``status`` is the recorded status, or ``died`` for a ``running`` run whose process is
    gone; ``checked`` is whether the process could be looked at (same host); ``detail`` says
    why when it died or was not checked.
    """

    status: str
    checked: bool
    detail: str | None = None


def process_started_after(pid: int, when: float) -> bool | None:
    """Whether the process ``pid`` of this host exists and started after ``when`` (``None``: it does not exist)."""
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process.create_time() > when + _CLOCK_SLACK_S
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:  # exists, but not ours to inspect: take it as the run's
        return False


def run_state(status: Mapping[str, Any] | None, *, hostname: str | None = None) -> RunState:
    """The status a reader shows for ``status.json``'s content (see the module docstring).

    ``hostname`` is this machine's (default :func:`socket.gethostname`).
    """
    if not status:
        return RunState("unknown", checked=False, detail="no status.json yet")
    recorded = str(status.get("status") or "unknown")
    if recorded != "running":
        return RunState(recorded, checked=False)
    pid, host = status.get("pid"), status.get("host")
    here = hostname if hostname is not None else socket.gethostname()
    if not isinstance(pid, int) or not host:
        return RunState("running", checked=False, detail="status.json records no process to check")
    if host != here:
        return RunState("running", checked=False, detail=f"runs on {host}; its process cannot be checked from {here}")
    updated = status.get("updated_time")
    reused = process_started_after(pid, float(updated) if isinstance(updated, (int, float)) else float("inf"))
    if reused is None:
        return RunState("died", checked=True, detail=f"its process {pid} on {host} is gone without recording an end")
    if reused:
        return RunState("died", checked=True, detail=f"its process {pid} on {host} is gone (the PID is reused)")
    return RunState("running", checked=True)
