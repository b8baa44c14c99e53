"""A worker ends when its parent process (its raylet) is gone, and not while the parent lives."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psutil

from telescope.runtime.worker_lifetime import parent_is_raylet

#: The parent: starts a child that watches it, prints the child's pid, then lives until its stdin closes.
PARENT = textwrap.dedent(
    """
    import subprocess, sys, threading, time
    child = subprocess.Popen([sys.executable, "-c", '''
    import threading, time
    from telescope.runtime.worker_lifetime import exit_when_parent_exits
    threading.Thread(target=lambda: time.sleep(0.05)).start()  # a thread ending is no parent ending
    exit_when_parent_exits(poll_s=0.05)
    time.sleep(3600)
    '''])
    print(child.pid, flush=True)
    threading.Thread(target=lambda: None).start()
    sys.stdin.read()
    """
)


def _status(pid: int) -> str | None:
    try:
        return str(psutil.Process(pid).status())
    except psutil.NoSuchProcess:
        return None


def _gone(pid: int) -> bool:
    return _status(pid) in (None, psutil.STATUS_ZOMBIE)


def test_a_worker_outlives_nothing_but_its_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None and parent.stdin is not None
    child = int(parent.stdout.readline())
    try:
        for _ in range(20):  # many polls while the parent lives: the child stays
            time.sleep(0.05)
            assert not _gone(child)
        parent.kill()  # SIGKILL: no clean-up in the parent, the child is orphaned
        parent.wait()
        deadline = time.monotonic() + 60  # a bound on "it goes"; without the watch it never would
        while not _gone(child):
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.05)
    finally:
        if not _gone(child):
            psutil.Process(child).kill()


def test_only_a_process_the_raylet_started_is_a_ray_worker() -> None:
    assert not parent_is_raylet()  # pytest's parent is a shell or an xdist worker
