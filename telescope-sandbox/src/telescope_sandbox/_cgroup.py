"""Per-sandbox cgroups for the local provider: one memory and process budget for all its processes.

Resource limits (``setrlimit``) hold per process, so several processes together can
use many times ``memory_mb``. A cgroup counts them together. :meth:`SandboxCgroup.create`
makes a child cgroup per sandbox, where the host may:

- cgroup v2 (the unified hierarchy, with the ``memory`` and ``pids`` controllers
  available): ``<parent>/telescope-<id>`` with ``memory.max``, ``memory.swap.max = 0``
  and ``pids.max``; the parent is ``cgroup_parent`` when given (a delegated cgroup),
  else the hierarchy's root;
- cgroup v1 (separate ``memory`` and ``pids`` hierarchies, as on hybrid hosts): a child
  of the host process's own cgroup in each, with ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes``, so swap does not extend it) and ``pids.max``.

The launcher's command writes itself into every ``cgroup.procs`` of the sandbox before
it drops privileges; its children inherit them and cannot leave (the directories are
the host's). When the memory is exhausted the kernel's OOM killer kills a process of
that sandbox only. :meth:`SandboxCgroup.kill` and :meth:`SandboxCgroup.remove` run at
``destroy()``. Nothing here raises: a host without a writable cgroup gets ``None`` and
the reason, which the provider reports at creation.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field

_MOUNTINFO = "/proc/self/mountinfo"
_SELF_CGROUP = "/proc/self/cgroup"


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _mounts() -> tuple[str | None, dict[str, tuple[str, str]]]:
    """The cgroup2 mount point and, per v1 controller, (mount point, mount root)."""
    v2: str | None = None
    v1: dict[str, tuple[str, str]] = {}
    with contextlib.suppress(OSError):
        for line in _read(_MOUNTINFO).splitlines():
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) < 5 or len(rest) < 3:
                continue
            root, point, fstype = fields[3], fields[4], rest[0]
            if fstype == "cgroup2" and v2 is None and root == "/":
                v2 = point
            elif fstype == "cgroup":
                for opt in rest[2].split(","):
                    v1.setdefault(opt, (point, root))
    return v2, v1


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under "" its v2 path."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in _read(_SELF_CGROUP).splitlines():
            _id, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                out[name] = path
    return out


@dataclass
class SandboxCgroup:
    """The cgroup directories of one sandbox (one per hierarchy it uses)."""

    dirs: list[str]
    version: int
    memory: bool = False
    pids: bool = False
    _oom_file: str | None = field(default=None, repr=False)

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a command writes itself into."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    @classmethod
    def create(
        cls, name: str, memory_bytes: int | None, max_processes: int | None, parent: str | None = None
    ) -> tuple[SandboxCgroup | None, str]:
        """A cgroup for one sandbox, or ``None`` and why not."""
        if not memory_bytes and not max_processes:
            return None, "no memory or process limit was asked for"
        try:
            return cls._create(name, memory_bytes, max_processes, parent)
        except Exception as exc:  # an unexpected layout must not break sandbox creation
            return None, f"cannot read this host's cgroup layout: {exc!r}"

    @classmethod
    def _create(
        cls, name: str, memory_bytes: int | None, max_processes: int | None, parent: str | None
    ) -> tuple[SandboxCgroup | None, str]:
        v2, v1 = _mounts()
        own = _own_paths()
        reasons: list[str] = []
        if v2 is not None or parent is not None:
            made, why = cls._create_v2(parent or v2 or "", name, memory_bytes, max_processes)
            if made is not None:
                return made, ""
            reasons.append(why)
        if "memory" in v1 or "pids" in v1:
            made, why = cls._create_v1(v1, own, name, memory_bytes, max_processes)
            if made is not None:
                return made, ""
            reasons.append(why)
        return None, "; ".join(reasons) or "no cgroup filesystem is mounted"

    @classmethod
    def _create_v2(
        cls, parent: str, name: str, memory_bytes: int | None, max_processes: int | None
    ) -> tuple[SandboxCgroup | None, str]:
        try:
            available = _read(os.path.join(parent, "cgroup.controllers")).split()
            if "memory" not in available or "pids" not in available:
                return None, f"cgroup v2 at {parent} lacks the memory or pids controller"
            enabled = _read(os.path.join(parent, "cgroup.subtree_control")).split()
            if "memory" not in enabled or "pids" not in enabled:
                _write(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
            path = os.path.join(parent, f"telescope-{name}")
            os.mkdir(path, 0o755)
        except OSError as exc:
            return None, f"cannot create a cgroup v2 under {parent}: {exc}"
        group = cls([path], 2, _oom_file=os.path.join(path, "memory.events"))
        try:
            if memory_bytes:
                _write(os.path.join(path, "memory.max"), str(memory_bytes))
                with contextlib.suppress(OSError):
                    _write(os.path.join(path, "memory.swap.max"), "0")
                group.memory = True
            if max_processes:
                _write(os.path.join(path, "pids.max"), str(max_processes))
                group.pids = True
        except OSError as exc:
            group.remove()
            return None, f"cannot set limits on the cgroup {path}: {exc}"
        return group, ""

    @classmethod
    def _create_v1(
        cls,
        v1: dict[str, tuple[str, str]],
        own: dict[str, str],
        name: str,
        memory_bytes: int | None,
        max_processes: int | None,
    ) -> tuple[SandboxCgroup | None, str]:
        group = cls([], 1)
        wanted = [("memory", memory_bytes), ("pids", max_processes)]
        try:
            for controller, value in wanted:
                if not value or controller not in v1:
                    continue
                point, root = v1[controller]
                mine = own.get(controller, "/")
                rel = os.path.relpath(mine, root) if mine.startswith(root) else "."
                path = os.path.normpath(os.path.join(point, rel, f"telescope-{name}"))
                os.mkdir(path, 0o755)
                group.dirs.append(path)
                if controller == "memory":
                    _write(os.path.join(path, "memory.limit_in_bytes"), str(value))
                    memsw = os.path.join(path, "memory.memsw.limit_in_bytes")
                    if os.path.exists(memsw):
                        _write(memsw, str(value))
                    group.memory = True
                    group._oom_file = os.path.join(path, "memory.oom_control")
                else:
                    _write(os.path.join(path, "pids.max"), str(value))
                    group.pids = True
        except OSError as exc:
            group.remove()
            return None, f"cannot create a cgroup v1: {exc}"
        if not group.dirs:
            return None, "cgroup v1 has neither a memory nor a pids hierarchy"
        return group, ""

    def oom_kills(self) -> int:
        """How many processes the OOM killer has killed in this sandbox so far."""
        if self._oom_file is None:
            return 0
        with contextlib.suppress(OSError, ValueError):
            for line in _read(self._oom_file).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def pids_now(self) -> set[int]:
        out: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(OSError, ValueError):
                out.update(int(p) for p in _read(procs).split())
        return out

    def kill(self) -> None:
        """Kill every process in the sandbox's cgroups (``cgroup.kill`` on v2)."""
        if self.version == 2:
            with contextlib.suppress(OSError):
                _write(os.path.join(self.dirs[0], "cgroup.kill"), "1")
        for _ in range(100):
            pids = self.pids_now()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        """Remove the cgroups (after :meth:`kill`; retried while dying processes leave)."""
        for path in self.dirs:
            for _ in range(100):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
