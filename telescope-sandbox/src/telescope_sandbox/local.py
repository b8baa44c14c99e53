"""The ``local`` provider: a sandbox is a private directory; a command, a limited subprocess.

The embedded default: no service, no container runtime, no network needed. Each
sandbox owns a fresh temporary directory (its working directory and ``HOME``); each
command runs through the launcher (:mod:`telescope_sandbox._launch`) in its own
session and process group, with:

- resource limits (``setrlimit``): CPU seconds (the timeout, rounded up, plus one),
  address space (``memory_mb``), number of processes (``max_processes``), size of any
  one written file (``disk_mb``), no core dumps, at most 1024 open files; ``cpu`` is
  applied as CPU affinity (that many cores), not as a quota;
- a total-disk check after every command: a sandbox whose directory has grown past
  ``disk_mb`` fails that command and is marked dirty;
- no network, through a fresh network namespace, where the kernel allows it
  (``Sandbox.network_isolated`` says whether it did);
- when the host process runs as root: its own unprivileged uid (picked at random
  from a reserved range), so it cannot read files that are not world-readable,
  cannot signal other processes, and is counted exactly by the process limit;
- a wall-clock timeout after which the command and every process it started are
  killed; every process a command leaves behind is killed when it ends.

What it does NOT protect against (use a remote provider for untrusted code at scale):

- it is not a container or VM: the sandbox sees the host's filesystem - everything
  world-readable (``/etc``, ``/usr``, other users' world-readable files) and, when
  the host does not run as root, every file of the host's own user - and it can write
  wherever its uid may (``/tmp``, and the host user's files when not root);
- kernel exploits, side channels, and resource use the limits do not cover (total
  memory of many processes, disk I/O bandwidth, ``/dev/shm``, kernel memory);
- without network namespaces (some containers forbid them) it has the host's network;
- without root, the process limit is approximate (``RLIMIT_NPROC`` counts all the
  host user's processes) and sandboxes of one host user can see each other's files;
- memory is limited as address space: runtimes that reserve large virtual ranges
  (JVM, Go, some JITs) may fail below ``memory_mb`` of real use.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import IO

from telescope.api.sandbox import ExecResult, Sandbox, SandboxError, SandboxLimits, SandboxProvider

_LAUNCHER = str(Path(__file__).with_name("_launch.py"))
#: Private uids (root only) come from [UID_BASE, UID_BASE + UID_SPAN).
UID_BASE = int(os.environ.get("TELESCOPE_SANDBOX_UID_BASE", "1900000000"))
UID_SPAN = 1 << 24
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Output kept per stream; the rest is read and dropped (a looping print cannot fill memory).
MAX_OUTPUT_BYTES = 1 << 20


def _drain(stream: IO[bytes], keep: int, out: list[bytes], dropped: list[int]) -> None:
    size = 0
    while True:
        chunk = stream.read(65536)
        if not chunk:
            break
        if size < keep:
            out.append(chunk[: keep - size])
        dropped[0] += max(0, size + len(chunk) - keep)
        size += len(chunk)
    stream.close()


def _dir_size(path: str) -> int:
    total = 0
    for root, dirs, files in os.walk(path, onerror=lambda e: None):
        for name in files + dirs:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total


class LocalSandbox(Sandbox):
    """A private directory plus limited subprocesses (see the module docstring)."""

    def __init__(self, limits: SandboxLimits, *, base_dir: str | None = None, python: str | None = None) -> None:
        self.limits = limits
        self.sandbox_id = f"local-{uuid.uuid4().hex[:12]}"
        self._root = tempfile.mkdtemp(prefix=f"telescope-{self.sandbox_id}-", dir=base_dir)
        self.workdir = os.path.join(self._root, "work")
        os.makedirs(os.path.join(self.workdir, ".tmp"))
        self.uid: int | None = None
        self.gid: int | None = None
        if os.geteuid() == 0:
            self.uid = self.gid = UID_BASE + random.randrange(UID_SPAN)
            for path in (self.workdir, os.path.join(self.workdir, ".tmp")):
                os.chown(path, self.uid, self.gid)
        os.chmod(self._root, 0o711)
        os.chmod(self.workdir, 0o700)
        self.python = python or shutil.which("python3", path=DEFAULT_PATH) or sys.executable
        self.network_isolated: bool | None = None
        self.dirty = False
        self._destroyed = False
        self._lock = threading.Lock()
        ncpu = os.cpu_count() or 1
        want = max(1, min(ncpu, math.ceil(limits.cpu))) if limits.cpu else ncpu
        first = random.randrange(ncpu)
        self._cpus = sorted({(first + i) % ncpu for i in range(want)})

    # ------------------------------------------------------------------ files
    def _resolve(self, path: str) -> str:
        if self._destroyed:
            raise SandboxError(f"sandbox {self.sandbox_id} has been destroyed")
        full = os.path.realpath(os.path.join(self.workdir, path))
        if full != self.workdir and not full.startswith(self.workdir + os.sep):
            raise SandboxError(f"path {path!r} is outside the sandbox {self.sandbox_id}")
        return full

    def upload(self, path: str, data: bytes) -> None:
        full = self._resolve(path)
        parent = os.path.dirname(full)
        os.makedirs(parent, exist_ok=True)
        if self.limits.disk_mb is not None and len(data) > self.limits.disk_mb * 1024 * 1024:
            raise SandboxError(f"file of {len(data)} bytes exceeds the disk limit of {self.limits.disk_mb} MB")
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if self.uid is not None:
            d = parent
            while d.startswith(self.workdir):
                os.chown(d, self.uid, self.uid)
                d = os.path.dirname(d)
            os.chown(full, self.uid, self.uid)

    def download(self, path: str) -> bytes:
        full = self._resolve(path)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise SandboxError(f"no file {path!r} in sandbox {self.sandbox_id}") from None
        except OSError as exc:
            raise SandboxError(f"cannot read {path!r} in sandbox {self.sandbox_id}: {exc}") from None
        with os.fdopen(fd, "rb") as f:
            return f.read()

    # --------------------------------------------------------------- commands
    def _env(self, extra: dict[str, str] | None) -> dict[str, str]:
        env = {
            "PATH": DEFAULT_PATH,
            "HOME": self.workdir,
            "TMPDIR": os.path.join(self.workdir, ".tmp"),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        env.update(extra or {})
        return env

    def execute(
        self,
        command: str | list[str],
        *,
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        if self._destroyed:
            raise SandboxError(f"sandbox {self.sandbox_id} has been destroyed")
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        timeout = timeout_s if timeout_s is not None else self.limits.timeout_s
        workdir = self._resolve(cwd) if cwd else self.workdir
        mem = self.limits.memory_mb
        spec: dict[str, object] = {
            "argv": argv,
            "env": self._env(env),
            "cwd": workdir,
            "timeout_s": timeout,
            "cpu_seconds": math.ceil(timeout) + 1 if timeout else None,
            "memory_bytes": mem * 1024 * 1024 if mem else None,
            "file_bytes": self.limits.disk_mb * 1024 * 1024 if self.limits.disk_mb else None,
            "max_processes": self.limits.max_processes,
            "uid": self.uid,
            "gid": self.gid,
            "network": self.limits.network,
            "cpus": self._cpus,
        }
        with self._lock:
            return self._run(spec, timeout)

    def _run(self, spec: dict[str, object], timeout: float | None) -> ExecResult:
        read_fd, write_fd = os.pipe()
        spec["status_fd"] = write_fd
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", _LAUNCHER, json.dumps(spec)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(write_fd,),
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            raise SandboxError(f"cannot start a command in sandbox {self.sandbox_id}: {exc}") from exc
        os.close(write_fd)
        assert proc.stdout is not None and proc.stderr is not None
        out: list[bytes] = []
        err: list[bytes] = []
        drop_out, drop_err = [0], [0]
        readers = [
            threading.Thread(target=_drain, args=(proc.stdout, MAX_OUTPUT_BYTES, out, drop_out), daemon=True),
            threading.Thread(target=_drain, args=(proc.stderr, MAX_OUTPUT_BYTES, err, drop_err), daemon=True),
        ]
        for t in readers:
            t.start()
        backstop = (timeout or 3600.0) + 15.0
        try:
            proc.wait(timeout=backstop)
        except subprocess.TimeoutExpired:
            self._hard_kill(proc)
        with os.fdopen(read_fd, "rb") as f:
            raw = f.read()
        for t in readers:
            t.join(timeout=5.0)
        duration = time.perf_counter() - t0
        try:
            status = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            status = {}
        stdout = b"".join(out).decode("utf-8", "replace")
        stderr = b"".join(err).decode("utf-8", "replace")
        if drop_out[0]:
            stdout += f"\n[sandbox: {drop_out[0]} more bytes of output dropped]"
        if drop_err[0]:
            stderr += f"\n[sandbox: {drop_err[0]} more bytes of output dropped]"
        if not status:
            self.dirty = True
            return ExecResult(
                exit_code=-1,
                stdout=stdout,
                stderr=stderr + "\n[sandbox: the launcher died; everything it started was killed]",
                duration_s=duration,
                timed_out=True,
            )
        self.network_isolated = bool(status.get("network_isolated"))
        exit_code = int(status["exit_code"])
        timed_out = bool(status["timed_out"])
        usage = {
            "cpu_s": float(status.get("cpu_s", 0.0)),
            "max_rss_mb": float(status.get("max_rss_mb", 0.0)),
            "leftover_processes": float(status.get("leftover_processes", 0)),
            "wall_s": float(status.get("duration_s", duration)),
        }
        if self.limits.disk_mb is not None:
            used = _dir_size(self.workdir) / (1024 * 1024)
            usage["disk_mb"] = used
            if used > self.limits.disk_mb:
                self.dirty = True
                stderr += f"\n[sandbox: disk limit exceeded: {used:.1f} MB used of {self.limits.disk_mb} MB]"
                exit_code = exit_code or 1
        if timed_out:
            self.dirty = True  # conservative: a pool replaces it rather than reuse it
            stderr += f"\n[sandbox: timed out after {spec.get('timeout_s')} s; all its processes were killed]"
        return ExecResult(exit_code, stdout, stderr, duration, timed_out=timed_out, resource_usage=usage)

    def _hard_kill(self, proc: subprocess.Popen[bytes]) -> None:
        """The launcher itself hung: kill its group and, with a private uid, everything of that uid."""
        self.dirty = True
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, 9)
        if self.uid is not None:
            subprocess.run([sys.executable, "-I", "-S", _LAUNCHER, "--kill-uid", str(self.uid)], timeout=30)
        proc.wait(timeout=30)

    # --------------------------------------------------------------- lifecycle
    def reset(self) -> None:
        """Empty the working directory so the sandbox can serve another sample."""
        if self._destroyed:
            raise SandboxError(f"sandbox {self.sandbox_id} has been destroyed")
        for name in os.listdir(self.workdir):
            if name == ".tmp":
                continue
            full = os.path.join(self.workdir, name)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full, ignore_errors=True)
            else:
                os.unlink(full)
        tmp = os.path.join(self.workdir, ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp, exist_ok=True)
        if self.uid is not None:
            os.chown(tmp, self.uid, self.uid)
        self.dirty = False

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        if self.uid is not None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run([sys.executable, "-I", "-S", _LAUNCHER, "--kill-uid", str(self.uid)], timeout=30)
        shutil.rmtree(self._root, ignore_errors=True)

    @property
    def destroyed(self) -> bool:
        return self._destroyed


class LocalProvider(SandboxProvider):
    """Creates :class:`LocalSandbox` objects (``base_dir``: where their directories go)."""

    name = "local"

    def __init__(self, base_dir: str | None = None, python: str | None = None) -> None:
        self.base_dir = base_dir
        self.python = python

    def create(self, limits: SandboxLimits | None = None) -> LocalSandbox:
        return LocalSandbox(limits or SandboxLimits(), base_dir=self.base_dir, python=self.python)
