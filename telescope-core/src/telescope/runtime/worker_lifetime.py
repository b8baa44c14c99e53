"""A run's Ray workers end when their node's raylet is gone.

Ray starts each worker in a process group of its own, so a ``SIGKILL`` of the run's
process group (a scheduler's hard stop, an OOM killer taking the driver's group) kills
the driver, the GCS and the raylet but not the actors' workers. Ray's core worker
notices a lost raylet only by its own checks, which took about a minute on one machine
and more than two and a half on another (a container whose init adopted the orphans).
Meanwhile a trainer rank holds its memory, its shared-memory folder and its CPUs.

:func:`exit_when_parent_exits` watches for that in a daemon thread: a worker's parent
is its raylet, and when the parent process ends the kernel gives the orphan a new
parent (init or a subreaper), so a changed ``getppid()`` means the raylet is gone. The
worker then ends at once with ``os._exit``, as Ray's own check would end it: no clean-up
runs (the raylet's death was not one), and what a clean exit would remove (the
transport's shared-memory folder) is removed by the next start, which finds its owner
dead. The poll costs one system call a second. A thread that merely exits in the
parent does not change ``getppid()`` (the parent is a process, not a thread), so a
raylet that lives never ends its workers.
"""

from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger(__name__)

#: Seconds between two looks at the parent: how long a worker outlives its raylet.
POLL_S = 1.0

#: The exit status of a worker whose raylet is gone (as a shell reports a process killed by SIGKILL).
EXIT_CODE = 137


def exit_when_parent_exits(poll_s: float = POLL_S) -> threading.Thread:
    """Start the daemon thread that ends this process (``os._exit``) once its parent process has ended."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                log.error("parent process %d (the raylet) is gone: this worker exits", parent)
                os._exit(EXIT_CODE)

    thread = threading.Thread(target=watch, name="exit-with-raylet", daemon=True)
    thread.start()
    return thread


def parent_is_raylet() -> bool:
    """Whether this process was started by a Ray raylet (it runs as a Ray worker, not in the driver)."""
    import psutil

    try:
        return psutil.Process(os.getppid()).name().startswith("raylet")
    except psutil.Error:
        return False


def exit_with_raylet() -> None:
    """In a Ray worker, end the process when its raylet is gone (:func:`exit_when_parent_exits`); else nothing."""
    if parent_is_raylet():
        exit_when_parent_exits()
