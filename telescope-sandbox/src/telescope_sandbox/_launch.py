"""The local provider's launcher: one short-lived process per sandbox command.

Run as ``python -I -S _launch.py`` by :mod:`telescope_sandbox.local`, which writes the
command's spec (JSON: argv, environment, limits, directories) to its stdin, so that no
value of the command's environment ever appears on a command line (``/proc/*/cmdline``
is readable by every user). It is never imported by the provider: it stays
standard-library only and starts fast. It is the session leader of a fresh session, and:

1. makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``), so every
   process the command leaves behind - even one that double-forks and calls
   ``setsid`` - is re-parented to the launcher instead of to init;
2. unless the spec turns namespaces off, enters a new PID namespace and, unless the
   network is allowed, a new, empty network namespace (not even loopback is up); as
   root directly, otherwise inside a new user namespace (which also makes the process
   limit count only the command's processes); it reports what worked;
3. forks the namespace's *init* (PID 1 there), which takes a private mount namespace
   in which the sandbox's own ``tmp`` and ``shm`` directories are bind-mounted over
   ``/tmp`` and ``/dev/shm`` (and a fresh ``/proc`` shows only the sandbox's
   processes), then forks the command and reaps every orphan until the command ends.
   When init ends, the kernel kills everything left in the namespace. Without a PID
   namespace the command is forked directly (after the same mounts, when allowed);
4. the command joins the sandbox's cgroups (when the host made some: memory and
   process limits for the whole sandbox), sets its resource limits (CPU seconds,
   address space, processes, file size, no core files, open files), pins itself to its
   CPUs, drops to the sandbox's own uid when the launcher is root, and ``exec``s;
5. waits with the wall-clock timeout, kills on expiry, then stops and kills every
   remaining descendant (a stop-then-kill sweep, so a fork bomb cannot outrun it; with
   a private uid, every process of that uid too) and reaps them before it exits;
6. writes a JSON status (exit code, timed out, CPU seconds, peak RSS, leftovers killed,
   which isolation held) to the status pipe the host passed.

``python _launch.py --kill-uid UID`` kills every process of UID (the host's backstop);
``python _launch.py --probe '{"namespaces": true}'`` reports which isolation this host
allows (the provider runs it once, to say at creation what each sandbox gets).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time
from typing import Any, NoReturn

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
#: Seconds the leftover sweep may take before it gives up (each pass is one /proc scan).
SWEEP_S = 5.0
_LIBC: Any = None


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int) -> None:
    src = source.encode() if source is not None else None
    fs = fstype.encode() if fstype is not None else None
    _check(_libc().mount(src, target.encode(), fs, ctypes.c_ulong(flags), None), f"mount {target}")


# ----------------------------------------------------------------- namespaces
def _map_ids(uid: int, gid: int) -> None:
    try:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    except OSError:
        pass  # the namespace exists; only the id mapping failed (ids show as nobody)


def _enter_namespaces(spec: dict[str, Any]) -> dict[str, bool]:
    """Unshare the PID (and, unless allowed, network) namespace; returns what worked."""
    got = {"user": False, "pid": False, "net": False}
    if not spec.get("namespaces", True):
        return got
    want_net = not spec.get("network", False)
    user = 0 if os.geteuid() == 0 else CLONE_NEWUSER
    uid, gid = os.getuid(), os.getgid()
    for pid, net in dict.fromkeys([(True, want_net), (False, want_net), (True, False)]):
        flags = user | (CLONE_NEWPID if pid else 0) | (CLONE_NEWNET if net else 0)
        if flags and _libc().unshare(flags) == 0:
            if user:
                _map_ids(uid, gid)
            return {"user": bool(user), "pid": pid, "net": net}
    return got


def _same_dir(path: str, fd: int) -> bool:
    try:
        a, b = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _mount_point(path: str) -> int:
    """A descriptor of directory ``path``, made where missing; no link is followed.

    Its parents now lie in the sandbox's own ``/tmp`` (or ``/dev/shm``), where an
    earlier command may have left a link: followed, it would make this root process
    create directories anywhere on the host.
    """
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", flags)
    try:
        for name in [part for part in path.split("/") if part]:
            try:
                nxt = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(name, 0o755, dir_fd=fd)
                nxt = os.open(name, flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _private_mounts(spec: dict[str, Any], fresh_proc: bool) -> bool:
    """A private mount namespace: the sandbox's own /tmp and /dev/shm, and maybe /proc.

    Raises OSError when the mount namespace or a bind mount is refused. Returns whether
    a fresh ``/proc`` (only this PID namespace's processes) was mounted.
    """
    _check(_libc().unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates to the host
    # Open every source first (in the new namespace: a bind mount's source must be in
    # it): once /tmp (or /dev/shm) is covered, paths under it are gone.
    names = ("tmp_dir", "shm_dir", "workdir")
    fds = {name: os.open(spec[name], os.O_PATH | os.O_DIRECTORY) for name in names}
    try:
        _mount(f"/proc/self/fd/{fds['tmp_dir']}", "/tmp", None, MS_BIND)
        _mount(f"/proc/self/fd/{fds['shm_dir']}", "/dev/shm", None, MS_BIND)
        workdir = spec["workdir"]
        if not _same_dir(workdir, fds["workdir"]):  # it was under /tmp or /dev/shm
            target = _mount_point(workdir)
            try:
                _mount(f"/proc/self/fd/{fds['workdir']}", f"/proc/self/fd/{target}", None, MS_BIND)
            finally:
                os.close(target)
    finally:
        for fd in fds.values():
            os.close(fd)
    if fresh_proc:
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except OSError:
            return False
        return True
    return False


def _setup(spec: dict[str, Any], report_w: int, fresh_proc: bool) -> None:
    """Mounts for the command (in init, or in the command itself without a PID namespace)."""
    tmp = proc = False
    if spec.get("private_tmp"):
        try:
            proc = _private_mounts(spec, fresh_proc)
            tmp = True
        except OSError as exc:
            os.write(2, f"sandbox: cannot make /tmp and /dev/shm private: {exc}\n".encode())
            os._exit(126)  # it was promised at creation: fail closed rather than run unisolated
    os.write(report_w, json.dumps({"tmp": tmp, "proc": proc}).encode() + b"\n")


# -------------------------------------------------------------------- command
def _user_process_count(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += 1
            except OSError:
                continue
    return count


def _set_limits(spec: dict[str, Any]) -> None:
    def setlim(which: int, value: int) -> None:
        try:
            _soft, hard = resource.getrlimit(which)
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass

    if spec.get("cpu_seconds"):
        soft = int(spec["cpu_seconds"])
        _s, hard = resource.getrlimit(resource.RLIMIT_CPU)
        resource.setrlimit(
            resource.RLIMIT_CPU, (soft, soft + 1 if hard == resource.RLIM_INFINITY else min(hard, soft + 1))
        )
    if spec.get("memory_bytes"):
        setlim(resource.RLIMIT_AS, int(spec["memory_bytes"]))
    if spec.get("file_bytes"):
        setlim(resource.RLIMIT_FSIZE, int(spec["file_bytes"]))
    if spec.get("max_processes"):
        # RLIMIT_NPROC counts the tasks of the real uid in the current user namespace:
        # exact with a private uid; in our own user namespace, the launcher (and init)
        # plus the command's; otherwise every process of the host user, so allow those.
        if spec.get("uid") is not None:
            base = 0
        elif spec.get("_userns"):
            base = 2 if spec.get("_pidns") else 1
        else:
            base = _user_process_count(os.getuid())
        setlim(resource.RLIMIT_NPROC, base + int(spec["max_processes"]))
    setlim(resource.RLIMIT_CORE, 0)
    setlim(resource.RLIMIT_NOFILE, 1024)


def _child(spec: dict[str, Any]) -> NoReturn:
    try:
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        for procs in spec.get("cgroup_procs") or ():
            with open(procs, "w") as f:  # "0": the writer; its children inherit the cgroup
                f.write("0")
        _set_limits(spec)
        cpus = spec.get("cpus")
        if cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, set(cpus))
        uid = spec.get("uid")
        if uid is not None:
            os.setgroups([])
            os.setgid(int(spec["gid"]))
            os.setuid(int(uid))
        os.chdir(spec["cwd"])
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        argv = spec["argv"]
        os.execvpe(argv[0], argv, spec["env"])
    except BaseException as exc:
        try:
            os.write(2, f"sandbox: cannot run {spec['argv'][0]!r}: {exc}\n".encode())
        finally:
            os._exit(127)
    os._exit(127)  # not reached: execvpe does not return


def _init(spec: dict[str, Any], report_w: int) -> NoReturn:
    """PID 1 of the command's namespace: mounts, runs the command, reaps orphans, reports."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # PID 1 ignores what it does not handle
        _setup(spec, report_w, fresh_proc=True)
        _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # a same-uid command cannot ptrace it
        pid = os.fork()
        if pid == 0:
            os.close(report_w)
            _child(spec)
        status = 0
        while True:
            try:
                done, st = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if done == pid:
                status = st
                break
        _reap()
        left = len(_tree(int(os.readlink("/proc/self"))))
        os.write(report_w, json.dumps({"status": status, "leftovers": left}).encode() + b"\n")
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(2, f"sandbox: the sandbox's init failed: {exc}\n".encode())
        os._exit(125)
    os._exit(0)  # the kernel now kills everything left in the namespace


# ------------------------------------------------------------------- cleanup
def _tree(root: int) -> set[int]:
    """Every live (not zombie) descendant of ``root``, from one scan of /proc."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: parse after the last ')'.
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 1 and fields[0] != b"Z":
            kids.setdefault(int(fields[1]), []).append(int(entry))
    out: set[int] = set()
    todo = [root]
    while todo:
        for child in kids.get(todo.pop(), ()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _reap(deadline: float = 0.0) -> None:
    """Reap finished children; until ``deadline`` (monotonic), wait for all of them."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() >= deadline:
                return
            time.sleep(0.002)


def _sweep(root: int) -> int:
    """Stop every descendant of ``root`` (stopped processes cannot fork), then kill them all.

    Returns how many there were. A pid is only reused after its zombie is reaped, and
    nothing is reaped until the kill, so a stopped pid still names the same process.
    """
    stopped: set[int] = set()
    end = time.monotonic() + SWEEP_S
    while time.monotonic() < end:
        fresh = _tree(root) - stopped
        if not fresh:
            break
        for pid in fresh:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= fresh
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _reap(time.monotonic() + SWEEP_S)
    return len(stopped)


def kill_uid(uid: int) -> None:
    """Kill every process of ``uid`` (as that uid: ``kill(-1)`` reaches exactly those)."""
    for _ in range(5):
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)
            except BaseException:
                pass
            os._exit(0)
        os.waitpid(pid, 0)
        if _user_process_count(uid) == 0:
            return
        time.sleep(0.01)


def _kill_leftovers(spec: dict[str, Any], pgid: int) -> int:
    """Kill and reap every remaining descendant; returns how many were found."""
    uid = spec.get("uid")
    found = 0
    if uid is not None and os.geteuid() == 0:
        found = _user_process_count(int(uid))
        if found:
            kill_uid(int(uid))
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)  # the command's own group, at once
    return max(found, _sweep(os.getpid()))


# ---------------------------------------------------------------------- main
def _wait(pid: int, timeout: float | None, start: float) -> bool:
    """Wait for ``pid`` to end, up to ``timeout`` seconds; returns whether it timed out."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:  # no pidfd: poll
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if timeout is not None and time.monotonic() - start > timeout:
                return True
            time.sleep(0.01)
        return False
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    return not ready


def _read_reports(fd: int) -> dict[str, Any]:
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 65536):
            data += chunk
    os.close(fd)
    out: dict[str, Any] = {}
    for line in data.splitlines():
        with contextlib.suppress(ValueError):
            out.update(json.loads(line))
    return out


def probe(opts: dict[str, Any]) -> dict[str, bool]:
    """Which isolation this host allows: namespaces, private /tmp, a fresh /proc."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            got = _enter_namespaces({"namespaces": opts.get("namespaces", True)})
            os.write(write_fd, json.dumps(got).encode() + b"\n")
            spec = {"private_tmp": True, "workdir": "/", "tmp_dir": "/tmp", "shm_dir": "/dev/shm"}
            if got["pid"]:
                inner = os.fork()  # PID 1 of the new namespace
                if inner == 0:
                    _setup(spec, write_fd, fresh_proc=True)
                    os._exit(0)
                os.waitpid(inner, 0)
            elif opts.get("namespaces", True):
                _setup(spec, write_fd, fresh_proc=False)
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    found = _read_reports(read_fd)
    return {k: bool(found.get(k)) for k in ("user", "pid", "net", "tmp", "proc")}


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--kill-uid":
        kill_uid(int(argv[2]))
        return 0
    if len(argv) == 3 and argv[1] == "--probe":
        print(json.dumps(probe(json.loads(argv[2]))))
        return 0
    spec: dict[str, Any] = json.loads(sys.stdin.buffer.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the command's stdin
    os.close(devnull)
    status_fd = int(spec["status_fd"])
    os.set_inheritable(status_fd, False)
    _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    ns = _enter_namespaces(spec)
    spec["_userns"], spec["_pidns"] = ns["user"], ns["pid"]
    _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # after the id maps: a same-uid command cannot ptrace it
    report_r, report_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(status_fd)
        os.close(report_r)
        if ns["pid"]:
            _init(spec, report_w)
        _setup(spec, report_w, fresh_proc=False)
        _child(spec)
    os.close(report_w)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also done by the child: whichever runs first
    timed_out = _wait(pid, spec.get("timeout_s"), start)
    seen = 0
    if timed_out:
        seen = len(_tree(pid)) - (1 if ns["pid"] else 0)  # besides the command itself
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # with a PID namespace, the kernel kills all of it
    _, status, usage = os.wait4(pid, 0)
    duration = time.monotonic() - start
    reports = _read_reports(report_r)
    if ns["pid"] and "status" in reports:
        status = int(reports["status"])
    leftovers = max(seen, int(reports.get("leftovers", 0)), _kill_leftovers(spec, pid))
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    if os.WIFEXITED(status):
        exit_code = os.WEXITSTATUS(status)
        term_signal = 0
    else:
        term_signal = os.WTERMSIG(status)
        exit_code = 128 + term_signal
    report = {
        "exit_code": exit_code,
        "signal": term_signal,
        "timed_out": timed_out,
        "duration_s": duration,
        "cpu_s": children.ru_utime + children.ru_stime,
        "max_rss_mb": max(usage.ru_maxrss, children.ru_maxrss) / 1024.0,
        "leftover_processes": leftovers,
        "network_isolated": ns["net"],
        "pid_isolated": ns["pid"],
        "tmp_isolated": bool(reports.get("tmp")),
        "proc_private": bool(reports.get("proc")),
    }
    os.write(status_fd, json.dumps(report).encode())
    os.close(status_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
