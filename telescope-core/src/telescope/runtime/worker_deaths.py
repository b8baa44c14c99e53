"""Why a worker process died, said plainly: out of memory only when memory ran out.

When an actor's process dies, Ray's error lists every cause it cannot rule out ("killed
by SIGKILL by OOM killer due to high memory usage, ray stop --force, SIGSEGV ..."): a
rank killed by a signal (a scheduler, a user, a test) then reads as if the machine had run
out of memory. :func:`death_reason` says instead what is known:

- Ray's memory monitor killed it (``OutOfMemoryError``, or its message says so): out of memory;
- the kernel's OOM killer ran on this node since the worker started (the ``oom_kill``
  counter of ``/proc/vmstat``, which counts the kills of every cgroup too, went up): likely
  out of memory;
- otherwise: killed by a signal or crashed, with no out-of-memory kill recorded.

Limits: the counter is read on the driver's node; a worker on another node gets "cause
unknown" rather than a guess. An OOM kill of another process on the node meanwhile makes a
signal kill read as "likely out of memory" (the kernel does not say whom it killed here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

VMSTAT = Path("/proc/vmstat")
_RAY_MEMORY_WORDS = ("low on memory", "memory monitor", "OutOfMemory")


def oom_kills(vmstat: Path = VMSTAT) -> int | None:
    """The kernel's count of OOM kills on this node since boot (``None`` where it is not available)."""
    try:
        for line in vmstat.read_text(encoding="ascii").splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def death_reason(error: BaseException, oom_kills_before: int | None, placement: list[dict[str, Any]]) -> str:
    """Why the worker whose call raised ``error`` (Ray's actor error) died, in one clause.

    ``oom_kills_before``: :func:`oom_kills` when the worker started; ``placement``: the
    worker's (``[]`` when unknown), whose ``node`` says whether it ran on this node (the
    counter says nothing about another).
    """
    if isinstance(error, ray.exceptions.OutOfMemoryError) or any(w in str(error) for w in _RAY_MEMORY_WORDS):
        return "Ray's memory monitor killed it: its node ran out of memory"
    if not placement or placement[0].get("node") != ray.util.get_node_ip_address():
        return "its process ended (cause unknown: it ran on another node, or where is not known; see its log)"
    now = oom_kills()
    if now is None or oom_kills_before is None:
        return "its process was killed or crashed"
    if now > oom_kills_before:
        return "the kernel's OOM killer ran on this node meanwhile: it likely ran out of memory"
    return "its process was killed by a signal or crashed (no out-of-memory kill on this node)"
