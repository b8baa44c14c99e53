"""This process's resident memory from ``/proc/self/status``, and its peak reset, for the benchmarks (Linux only)."""

from __future__ import annotations

from pathlib import Path


def status_bytes(field: str) -> int:
    """A ``/proc/self/status`` memory field (``VmHWM``: the resident set's peak, ``VmRSS``), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak_rss() -> int:
    """Set ``VmHWM`` to the current resident set (``clear_refs`` 5); returns that resident set, in bytes."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_bytes("VmRSS")
