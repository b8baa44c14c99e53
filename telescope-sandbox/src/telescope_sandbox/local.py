"""The ``local`` provider: a sandbox is a private directory; a command, a limited subprocess.

The embedded default: no service, no container runtime, no network needed. Each
sandbox owns a fresh temporary directory (its working directory and ``HOME``, plus
its own ``tmp`` and ``shm``); each command runs through the launcher
(:mod:`telescope_sandbox._launch`, which gets the command and its environment on its
stdin, never on a command line) in its own session, with:

- resource limits (``setrlimit``): CPU seconds (the timeout, rounded up, plus one),
  address space per process (``memory_mb``), number of processes (``max_processes``),
  size of any one written file (``disk_mb``), no core dumps, at most 1024 open files;
  ``cpu`` is applied as CPU affinity (that many cores), not as a quota;
- where the host may create cgroups (root, or a delegated ``cgroup_parent``; see
  :mod:`telescope_sandbox._cgroup`): one memory budget (``memory_mb``) and one process
  budget (``max_processes``) for all the sandbox's processes together;
- its own PID namespace, where the kernel allows it: the timeout kills every process
  of the command at once, and a fresh ``/proc`` (where it may be mounted) shows only
  the sandbox's processes;
- a private ``/tmp`` and ``/dev/shm`` (the sandbox's own directories, bind-mounted in
  a private mount namespace), where the kernel allows it: nothing written there
  outlives ``destroy()`` (or survives ``reset()``), and no host socket in ``/tmp`` can
  be reached; without root, these namespaces live in a user namespace;
- a total-disk check after every command (working directory, ``/tmp`` and
  ``/dev/shm`` together, however deep; :mod:`telescope_sandbox._cleanup`): a sandbox
  that has grown past ``disk_mb`` fails that command and is marked dirty;
- no network, through a fresh network namespace, where the kernel allows it;
- when the host process runs as root: its own unprivileged uid (picked at random
  from a reserved range), so it cannot read files that are not world-readable,
  cannot signal other processes, and is counted exactly by the process limit (without
  root, a user namespace makes that count exact where the kernel allows one);
- a wall-clock timeout after which the command and every process it started are
  killed; every process a command leaves behind is killed when it ends (a
  stop-then-kill sweep of every descendant, so a fork bomb cannot outrun it).

The host's own file work follows no link the sandbox made: ``upload`` and ``download``
resolve paths one no-follow component at a time and create through a host-only
staging directory (:mod:`telescope_sandbox._transfer`); they may run beside a command.
``reset`` and ``destroy`` wait for a running command (``destroy`` kills it first),
remove trees of any depth without following links, and raise :class:`SandboxError`
when something is left.

Which of these a sandbox got is known at creation: ``LocalSandbox.protections`` (a dict
of flags, also ``network_isolated`` and ``tmp_isolated``) with the reason for each
missing one in ``LocalSandbox.missing``; :class:`LocalProvider` logs them once, and
refuses to create sandboxes lacking any protection named in its ``require``.

What it does NOT protect against (use a remote provider for untrusted code at scale):

- it is not a container or VM: the sandbox sees the host's filesystem outside ``/tmp``
  and ``/dev/shm`` - everything world-readable (``/etc``, ``/usr``, other users'
  world-readable files) and, when the host does not run as root, every file of the
  host's own user, which it can also modify; sockets outside ``/tmp`` (``/run``, ...)
  that its uid may open;
- kernel exploits, side channels, and resources the limits do not cover (disk I/O
  bandwidth, kernel memory, CPU time beyond the affinity);
- without cgroups (a host not running as root, or no writable cgroup), memory is limited
  per process only: several processes together can use several times ``memory_mb``;
- without mount namespaces, ``/tmp`` and ``/dev/shm`` are the host's: a host socket
  there can be reached, and what the sandbox leaves there is removed at ``destroy()``
  only when it has a private uid (root host);
- without network namespaces (some containers forbid them) it has the host's network;
  with ``network=True`` it also reaches abstract Unix sockets of the host;
- without root, sandboxes of one host user share a uid: they can read each other's
  directories when those are outside the private ``/tmp`` (a custom ``base_dir``) and,
  without a PID namespace, each other's processes and ``/proc/<pid>/environ`` (and a
  command can kill its own launcher, escaping the cleanup); without a user namespace
  the process limit is approximate (``RLIMIT_NPROC`` then counts all the host user's
  processes);
- without root, what the sandbox puts in a directory it makes unreadable escapes the
  disk check (the size limit of each file still holds);
- memory is limited as address space too: runtimes that reserve large virtual ranges
  (JVM, Go, some JITs) may fail below ``memory_mb`` of real use.
"""

from __future__ import annotations

import contextlib
import json
import logging
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
from collections.abc import Collection
from pathlib import Path
from typing import IO

from telescope.api.sandbox import ExecResult, Sandbox, SandboxError, SandboxLimits, SandboxProvider
from telescope_sandbox._cgroup import SandboxCgroup
from telescope_sandbox._cleanup import clear_dir, dir_size, force_remove, remove_owned
from telescope_sandbox._transfer import SandboxFiles

logger = logging.getLogger(__name__)

_LAUNCHER = str(Path(__file__).with_name("_launch.py"))
#: Private uids (root only) come from [UID_BASE, UID_BASE + UID_SPAN).
UID_BASE = int(os.environ.get("TELESCOPE_SANDBOX_UID_BASE", "1900000000"))
UID_SPAN = 1 << 24
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Output kept per stream; the rest is read and dropped (a looping print cannot fill memory).
MAX_OUTPUT_BYTES = 1 << 20
#: The protections a sandbox can have (keys of ``LocalSandbox.protections``).
PROTECTIONS = (
    "private_uid",
    "network_isolated",
    "pid_isolated",
    "tmp_isolated",
    "memory_per_sandbox",
    "processes_per_sandbox",
)
_HOST_SHARED_DIRS = ("/tmp", "/dev/shm")
_WAIVED = ("turned off", "namespaces turned off", "the limits allow", "no memory limit asked")

_probe_lock = threading.Lock()
_probes: dict[tuple[int, bool], dict[str, bool]] = {}


def _drain(stream: IO[bytes], keep: int, out: list[bytes], dropped: list[int]) -> None:
    """Read ``stream`` to its end, keeping its first ``keep`` bytes and counting the rest."""
    size = 0
    while True:
        chunk = stream.read(65536)
        if not chunk:
            break
        kept = max(0, min(len(chunk), keep - size))
        if kept:
            out.append(chunk[:kept])
        dropped[0] += len(chunk) - kept
        size += len(chunk)
    stream.close()


def _launcher_python() -> str:
    """An interpreter for the launcher: this one, unless this uid may not run it."""
    if os.access(sys.executable, os.X_OK):
        return sys.executable
    return shutil.which("python3", path=DEFAULT_PATH) or sys.executable


def probe_host(use_namespaces: bool = True) -> dict[str, bool]:
    """Which isolation the launcher gets on this host (run once per process and uid).

    Keys: ``user``, ``pid``, ``net`` (namespaces), ``tmp`` (private /tmp and /dev/shm),
    ``proc`` (a fresh /proc).
    """
    key = (os.geteuid(), use_namespaces)
    with _probe_lock:
        if key not in _probes:
            found: dict[str, bool] = {}
            if use_namespaces:
                opts = json.dumps({"namespaces": True})
                with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
                    out = subprocess.run(
                        [_launcher_python(), "-I", "-S", _LAUNCHER, "--probe", opts],
                        capture_output=True,
                        timeout=30,
                        env={"PATH": DEFAULT_PATH},
                        cwd="/",
                    ).stdout
                    found = json.loads(out)
            _probes[key] = {k: bool(found.get(k)) for k in ("user", "pid", "net", "tmp", "proc")}
        return dict(_probes[key])


class LocalSandbox(Sandbox):
    """A private directory plus limited subprocesses (see the module docstring)."""

    def __init__(
        self,
        limits: SandboxLimits,
        *,
        base_dir: str | None = None,
        python: str | None = None,
        use_namespaces: bool = True,
        use_cgroups: bool = True,
        cgroup_parent: str | None = None,
    ) -> None:
        self.limits = limits
        self.sandbox_id = f"local-{uuid.uuid4().hex[:12]}"
        # canonical: the launcher re-creates this path inside the sandbox's /tmp following no link
        self._root = os.path.realpath(tempfile.mkdtemp(prefix=f"telescope-{self.sandbox_id}-", dir=base_dir))
        self.workdir = os.path.join(self._root, "work")
        self._tmp = os.path.join(self._root, "tmp")  # its /tmp, with a private mount namespace
        self._shm = os.path.join(self._root, "shm")  # its /dev/shm
        os.makedirs(os.path.join(self.workdir, ".tmp"))
        os.mkdir(self._tmp, 0o700)
        os.mkdir(self._shm, 0o700)
        staging = os.path.join(self._root, "stage")  # the host's, for files it hands to the sandbox
        os.mkdir(staging, 0o700)
        self.uid: int | None = None
        self.gid: int | None = None
        if os.geteuid() == 0:
            self.uid = self.gid = UID_BASE + random.randrange(UID_SPAN)
            for path in (self.workdir, os.path.join(self.workdir, ".tmp"), self._tmp, self._shm):
                os.chown(path, self.uid, self.gid)
        os.chmod(self._root, 0o711)
        os.chmod(self.workdir, 0o700)
        self._files = SandboxFiles(self.sandbox_id, self.workdir, staging, self.uid, self.gid)
        self.python = python or shutil.which("python3", path=DEFAULT_PATH) or sys.executable
        self._use_namespaces = use_namespaces
        self.dirty = False
        self._destroyed = False
        self._ran = False  # whether a command ever ran (only then can it have left files outside)
        self._lock = threading.Lock()  # one command at a time; reset and destroy wait for it
        self._files_lock = threading.Lock()  # transfers run beside a command, never beside a cleanup
        ncpu = os.cpu_count() or 1
        want = max(1, min(ncpu, math.ceil(limits.cpu))) if limits.cpu else ncpu
        first = random.randrange(ncpu)
        self._cpus = sorted({(first + i) % ncpu for i in range(want)})
        self.cgroup: SandboxCgroup | None = None
        cgroup_why = "turned off (use_cgroups=False)"
        if use_cgroups and (os.geteuid() == 0 or cgroup_parent):
            mem = limits.memory_mb * 1024 * 1024 if limits.memory_mb else None
            self.cgroup, cgroup_why = SandboxCgroup.create(self.sandbox_id, mem, limits.max_processes, cgroup_parent)
        elif use_cgroups:
            cgroup_why = "the host does not run as root (pass cgroup_parent= for a delegated cgroup)"
        self._set_protections(probe_host(use_namespaces), cgroup_why)

    def _set_protections(self, host: dict[str, bool], cgroup_why: str) -> None:
        ns_why = "namespaces turned off (use_namespaces=False)" if not self._use_namespaces else ""
        cg = self.cgroup
        flags = {
            "private_uid": (self.uid is not None, "the host does not run as root"),
            "network_isolated": (
                host["net"] and not self.limits.network,
                "the limits allow the network" if self.limits.network else ns_why or "no network namespace here",
            ),
            "pid_isolated": (host["pid"], ns_why or "no PID namespace here"),
            "tmp_isolated": (host["tmp"], ns_why or "no mount namespace here"),
            "memory_per_sandbox": (
                cg is not None and cg.memory,
                cgroup_why or "no memory cgroup" if self.limits.memory_mb else "no memory limit asked for",
            ),
            "processes_per_sandbox": (
                (cg is not None and cg.pids) or self.uid is not None or host["user"],
                f"no private uid, user namespace ({ns_why or 'not allowed here'}) or pids cgroup ({cgroup_why})",
            ),
        }
        #: Which protections this sandbox has (see the module docstring).
        self.protections: dict[str, bool] = {name: ok for name, (ok, _) in flags.items()}
        #: Why each missing protection is missing.
        self.missing: dict[str, str] = {name: why for name, (ok, why) in flags.items() if not ok}
        #: The missing ones that were turned off or not asked for (no warning for those).
        self.waived: set[str] = {name for name, why in self.missing.items() if why.startswith(_WAIVED)}
        self.network_isolated: bool = self.protections["network_isolated"]
        self.tmp_isolated: bool = self.protections["tmp_isolated"]

    # ------------------------------------------------------------------ files
    def _resolve(self, path: str) -> str:
        if self._destroyed:
            raise SandboxError(f"sandbox {self.sandbox_id} has been destroyed")
        full = os.path.realpath(os.path.join(self.workdir, path))
        if full != self.workdir and not full.startswith(self.workdir + os.sep):
            raise SandboxError(f"path {path!r} is outside the sandbox {self.sandbox_id}")
        return full

    def upload(self, path: str, data: bytes) -> None:
        """Write a file as the sandbox's user; no link the sandbox made is followed (:mod:`._transfer`)."""
        if self.limits.disk_mb is not None and len(data) > self.limits.disk_mb * 1024 * 1024:
            raise SandboxError(f"file of {len(data)} bytes exceeds the disk limit of {self.limits.disk_mb} MB")
        with self._files_lock:
            self._check_alive()
            try:
                self._files.write(path, data)
            except OSError as exc:  # the staging or working directory itself failed (full disk, ...)
                raise SandboxError(f"cannot upload {path!r} to sandbox {self.sandbox_id}: {exc}") from exc

    def download(self, path: str) -> bytes:
        """Read a regular file of the sandbox's user; no link the sandbox made is followed."""
        with self._files_lock:
            self._check_alive()
            try:
                return self._files.read(path)
            except OSError as exc:
                raise SandboxError(f"cannot download {path!r} from sandbox {self.sandbox_id}: {exc}") from exc

    def _check_alive(self) -> None:
        if self._destroyed:
            raise SandboxError(f"sandbox {self.sandbox_id} has been destroyed")

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
            "workdir": self.workdir,
            "tmp_dir": self._tmp,
            "shm_dir": self._shm,
            "private_tmp": self.tmp_isolated,
            "namespaces": self._use_namespaces,
            "cgroup_procs": self.cgroup.procs_files if self.cgroup else [],
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
            self._check_alive()  # again: a destroy may have begun while this waited
            self._ran = True
            return self._run(spec, timeout)

    def _run(self, spec: dict[str, object], timeout: float | None) -> ExecResult:
        read_fd, write_fd = os.pipe()
        spec["status_fd"] = write_fd
        ooms = self.cgroup.oom_kills() if self.cgroup else 0
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(
                [_launcher_python(), "-I", "-S", _LAUNCHER],  # the spec goes to its stdin, not here
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(write_fd,),
                start_new_session=True,
                close_fds=True,
                env={"PATH": DEFAULT_PATH},  # none of the host's environment, not even for the launcher
                cwd="/",
            )
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            raise SandboxError(f"cannot start a command in sandbox {self.sandbox_id}: {exc}") from exc
        os.close(write_fd)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        out: list[bytes] = []
        err: list[bytes] = []
        drop_out, drop_err = [0], [0]
        readers = [
            threading.Thread(target=_drain, args=(proc.stdout, MAX_OUTPUT_BYTES, out, drop_out), daemon=True),
            threading.Thread(target=_drain, args=(proc.stderr, MAX_OUTPUT_BYTES, err, drop_err), daemon=True),
        ]
        for t in readers:
            t.start()
        with contextlib.suppress(OSError):  # a launcher that died early: reported below
            proc.stdin.write(json.dumps(spec).encode())
        with contextlib.suppress(OSError):
            proc.stdin.close()
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
        self._note_isolation(status)
        exit_code = int(status["exit_code"])
        timed_out = bool(status["timed_out"])
        usage = {
            "cpu_s": float(status.get("cpu_s", 0.0)),
            "max_rss_mb": float(status.get("max_rss_mb", 0.0)),
            "leftover_processes": float(status.get("leftover_processes", 0)),
            "wall_s": float(status.get("duration_s", duration)),
        }
        if self.cgroup is not None:
            killed = self.cgroup.oom_kills() - ooms
            if killed > 0:
                usage["oom_kills"] = float(killed)
                stderr += (
                    f"\n[sandbox: the memory limit of {self.limits.memory_mb} MB for all its processes together "
                    f"was reached; {killed} process(es) killed]"
                )
        if self.limits.disk_mb is not None:
            try:
                used = dir_size(self.workdir, self._tmp, self._shm) / (1024 * 1024)
            except OSError as exc:  # the tree changed under the walk: something still runs there
                self.dirty = True
                stderr += f"\n[sandbox: its disk use could not be measured: {exc}]"
                exit_code = exit_code or 1
            else:
                usage["disk_mb"] = used
                if used > self.limits.disk_mb:
                    self.dirty = True
                    stderr += f"\n[sandbox: disk limit exceeded: {used:.1f} MB used of {self.limits.disk_mb} MB]"
                    exit_code = exit_code or 1
        if timed_out:
            self.dirty = True  # conservative: a pool replaces it rather than reuse it
            stderr += f"\n[sandbox: timed out after {spec.get('timeout_s')} s; all its processes were killed]"
        return ExecResult(exit_code, stdout, stderr, duration, timed_out=timed_out, resource_usage=usage)

    def _note_isolation(self, status: dict[str, object]) -> None:
        """A namespace the probe promised but this command did not get is no longer claimed."""
        for flag, key, why in (
            ("network_isolated", "network_isolated", "a command did not get a network namespace"),
            ("pid_isolated", "pid_isolated", "a command did not get a PID namespace"),
        ):
            if self.protections[flag] and not status.get(key):
                self.protections[flag] = False
                self.missing[flag] = why
        self.network_isolated = self.protections["network_isolated"]

    def _hard_kill(self, proc: subprocess.Popen[bytes]) -> None:
        """The launcher itself hung: kill its group and, with a private uid, everything of that uid."""
        self.dirty = True
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, 9)
        self._kill_all()
        proc.wait(timeout=30)

    def _kill_all(self) -> None:
        if self.uid is not None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    [_launcher_python(), "-I", "-S", _LAUNCHER, "--kill-uid", str(self.uid)],
                    timeout=30,
                    env={"PATH": DEFAULT_PATH},
                )
        if self.cgroup is not None:
            self.cgroup.kill()

    # --------------------------------------------------------------- lifecycle
    def reset(self) -> None:
        """Empty the working directory, /tmp and /dev/shm so the sandbox can serve another sample.

        Waits for a running command and for transfers. Raises :class:`SandboxError`
        (and leaves the sandbox dirty) when something could not be removed.
        """
        with self._lock, self._files_lock:
            self._check_alive()
            try:
                for path in (self.workdir, self._tmp, self._shm):
                    clear_dir(path)
                self._files.make_dirs(".tmp")
            except (OSError, SandboxError) as exc:
                self.dirty = True
                raise SandboxError(f"cannot reset sandbox {self.sandbox_id}: {exc}") from exc
            if self.uid is not None and not self.tmp_isolated and self._ran:
                remove_owned(self.uid, _HOST_SHARED_DIRS)
            self.dirty = False

    def destroy(self) -> None:
        """Kill everything, then (after a running command ends) remove the sandbox's files.

        Raises :class:`SandboxError` when its directory could not be removed whole.
        """
        if self._destroyed:
            return
        self._destroyed = True
        self._kill_all()
        with self._lock, self._files_lock:
            if self.cgroup is not None:
                self.cgroup.remove()
            try:
                force_remove(self._root)
            except OSError as exc:
                raise SandboxError(f"sandbox {self.sandbox_id}: cannot remove {self._root}: {exc}") from exc
            finally:
                if self.uid is not None and not self.tmp_isolated and self._ran:
                    remove_owned(self.uid, _HOST_SHARED_DIRS)

    @property
    def destroyed(self) -> bool:
        return self._destroyed


class LocalProvider(SandboxProvider):
    """Creates :class:`LocalSandbox` objects.

    ``base_dir``: where their directories go (default: the system's temporary
    directory). ``require``: protections (names in :data:`PROTECTIONS`) without which
    ``create`` raises :class:`SandboxError` instead of warning. ``use_namespaces`` and
    ``use_cgroups`` turn those mechanisms off (for hosts where they misbehave);
    ``cgroup_parent`` names a delegated cgroup v2 to create sandbox cgroups under.
    """

    name = "local"

    def __init__(
        self,
        base_dir: str | None = None,
        python: str | None = None,
        *,
        require: Collection[str] = (),
        use_namespaces: bool = True,
        use_cgroups: bool = True,
        cgroup_parent: str | None = None,
    ) -> None:
        unknown = sorted(set(require) - set(PROTECTIONS))
        if unknown:
            raise ValueError(f"unknown local sandbox protections {unknown}; known: {list(PROTECTIONS)}")
        self.base_dir = base_dir
        self.python = python
        self.require = tuple(require)
        self.use_namespaces = use_namespaces
        self.use_cgroups = use_cgroups
        self.cgroup_parent = cgroup_parent
        #: The protections of the latest sandbox created (``None`` before the first).
        self.protections: dict[str, bool] | None = None
        self._logged: set[tuple[tuple[str, str], ...]] = set()
        self._log_lock = threading.Lock()

    def create(self, limits: SandboxLimits | None = None) -> LocalSandbox:
        sandbox = LocalSandbox(
            limits or SandboxLimits(),
            base_dir=self.base_dir,
            python=self.python,
            use_namespaces=self.use_namespaces,
            use_cgroups=self.use_cgroups,
            cgroup_parent=self.cgroup_parent,
        )
        self.protections = dict(sandbox.protections)
        refused = {name: sandbox.missing[name] for name in self.require if name in sandbox.missing}
        if refused:
            sandbox.destroy()
            raise SandboxError(f"local sandbox lacks required protections: {refused}")
        key = tuple(sorted(sandbox.missing.items()))
        with self._log_lock:
            if key in self._logged:
                return sandbox
            self._logged.add(key)
        active = [name for name, ok in sandbox.protections.items() if ok]
        if set(sandbox.missing) - sandbox.waived:
            logger.warning("local sandboxes: active protections %s; MISSING %s", active, sandbox.missing)
        else:
            logger.info("local sandboxes: active protections %s; off by choice %s", active, sandbox.missing)
        return sandbox
