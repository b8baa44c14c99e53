"""The local provider's launcher: one short-lived process per sandbox command.

Run as ``python -I -S _launch.py '<spec json>'`` by :mod:`telescope_sandbox.local`
(never imported by it: it must stay standard-library only and start fast). It is the
session leader of a fresh session and process group, and:

1. makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``), so every
   process the command leaves behind - even one that double-forks and calls
   ``setsid`` - is re-parented to the launcher instead of to init;
2. unless the network is allowed, moves into a new, empty network namespace
   (``unshare(CLONE_NEWNET)`` as root, ``CLONE_NEWUSER|CLONE_NEWNET`` otherwise), in
   which not even loopback is up; it reports whether that worked;
3. forks the command, which sets its resource limits (CPU seconds, address space,
   processes, file size, no core files, open files), pins itself to its CPUs, drops
   to the sandbox's own uid when the launcher is root, and ``exec``s;
4. waits for the command with the wall-clock timeout, kills it on expiry, then kills
   and reaps every remaining descendant (and, with a private uid, every process of
   that uid) before it exits; so nothing outlives a command;
5. writes a JSON status (exit code, timed out, CPU seconds, peak RSS, leftovers
   killed, network isolated) to the status pipe the host passed.

``python _launch.py --kill-uid UID`` kills every process of UID (the host's backstop).
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
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
_LIBC: Any = None


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _isolate_network() -> bool:
    libc = _libc()
    if os.geteuid() == 0:
        return bool(libc.unshare(CLONE_NEWNET) == 0)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return False
    try:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    except OSError:
        pass  # the namespace exists; only the id mapping failed (ids show as nobody)
    return True


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
        uid = spec.get("uid")
        # RLIMIT_NPROC counts every process of the real uid: exact with a private uid,
        # otherwise allow the user's existing processes plus the sandbox's share.
        base = 0 if uid is not None else _user_process_count(os.getuid())
        setlim(resource.RLIMIT_NPROC, base + int(spec["max_processes"]))
    setlim(resource.RLIMIT_CORE, 0)
    setlim(resource.RLIMIT_NOFILE, 1024)


def _child(spec: dict[str, Any]) -> None:
    try:
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
        argv = spec["argv"]
        os.execvpe(argv[0], argv, spec["env"])
    except BaseException as exc:
        try:
            os.write(2, f"sandbox: cannot run {spec['argv'][0]!r}: {exc}\n".encode())
        finally:
            os._exit(127)


def _children(pid: int) -> list[int]:
    out: list[int] = []
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
        if len(fields) > 1 and int(fields[1]) == pid and fields[0] != b"Z":
            out.append(int(entry))
    return out


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


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


def _kill_leftovers(spec: dict[str, Any]) -> int:
    """Kill and reap every remaining descendant; returns how many were found."""
    uid = spec.get("uid")
    found = 0
    if uid is not None and os.geteuid() == 0:
        found = _user_process_count(int(uid))
        if found:
            kill_uid(int(uid))
    killed: set[int] = set()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        _reap()
        children = _children(os.getpid())
        if not children:
            break
        for pid in children:
            killed.add(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)
    _reap()
    return max(found, len(killed))


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--kill-uid":
        kill_uid(int(argv[2]))
        return 0
    spec: dict[str, Any] = json.loads(argv[1])
    status_fd = int(spec["status_fd"])
    os.set_inheritable(status_fd, False)
    _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    network_isolated = False
    if not spec.get("network", False):
        try:
            network_isolated = _isolate_network()
        except OSError:
            network_isolated = False
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(status_fd)
        _child(spec)
    timeout = spec.get("timeout_s")
    timed_out = False
    try:
        pidfd = os.pidfd_open(pid)
        ready, _, _ = select.select([pidfd], [], [], timeout)
        os.close(pidfd)
        timed_out = not ready
    except OSError:  # no pidfd: poll
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if timeout is not None and time.monotonic() - start > timeout:
                timed_out = True
                break
            time.sleep(0.01)
    if timed_out:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    duration = time.monotonic() - start
    leftovers = _kill_leftovers(spec)
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
        "network_isolated": network_isolated,
    }
    os.write(status_fd, json.dumps(report).encode())
    os.close(status_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
