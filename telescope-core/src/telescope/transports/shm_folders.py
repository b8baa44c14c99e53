"""The memory transport's shared-memory folders: named by owner, removed on every exit, reclaimed when orphaned.

A folder holds two copies of a model's weights in RAM (``/dev/shm`` is memory), so none may
outlive its run. Each is named ``telescope-weights-p<pid>-<run id>-<random>``: the process
that owns it (trainer rank 0, the sender) and the run it belongs to. Three layers remove it:

1. its owner, on every exit it lives through (:func:`create_owned_folder` registers the
   removal): the transport's ``close``, interpreter exit (``atexit``, which also runs when a
   Ray worker gets SIGTERM: Ray turns it into ``SystemExit``), and SIGTERM in a plain
   process (a handler installed when the folder is created on the main thread, chained to
   the previous one);
2. the run's driver, which outlives rank 0 except when it is SIGKILLed itself: it removes
   every folder of its run id when a trainer group is replaced and when the run ends
   (:func:`remove_run_folders`), whatever the reason;
3. the next start: :func:`reclaim_orphaned_folders` removes the folders whose owning process
   is gone (a rank 0 SIGKILLed together with its driver, a machine-wide OOM kill).

Limits: liveness is a PID check on this machine (``/dev/shm`` is per machine); a PID reused
by an unrelated process keeps an orphaned folder until that process ends too (kept, never
wrongly deleted); two containers that share ``/dev/shm`` but not their PID namespace see
each other's owners as dead, so such a setup must give each container its own ``/dev/shm``
(Docker's default). Folders named before this scheme (``telescope-weights-<random>``) name no
owner and are left alone.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from types import FrameType

PREFIX = "telescope-weights-"
_OWNED = re.compile(rf"^{re.escape(PREFIX)}p(?P<pid>\d+)-")
_RUN_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")

_owned: set[Path] = set()
_lock = threading.Lock()
_hooks_installed = False


def shm_parent() -> Path | None:
    """``/dev/shm`` where it exists and is writable, else ``None`` (the temporary directory is used)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else None


def folder_tag(run_id: str) -> str:
    """``run_id`` as it appears in a folder name (characters a file name may hold)."""
    return _RUN_ID_UNSAFE.sub("_", run_id) or "run"


def owner_pid(folder: Path) -> int | None:
    """The PID a folder's name gives as its owner, ``None`` for a name that gives none."""
    match = _OWNED.match(folder.name)
    return int(match.group("pid")) if match else None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (a zombie counts as gone)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # exists, but not ours to inspect
        return True


def create_owned_folder(run_id: str, parent: Path | None = None) -> Path:
    """A new folder owned by this process under ``parent`` (default: :func:`shm_parent`), removed at its exit."""
    base = parent if parent is not None else shm_parent()
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}p{os.getpid()}-{folder_tag(run_id)}-", dir=base))
    with _lock:
        _owned.add(folder)
    _install_exit_hooks()
    return folder


def remove_owned_folder(folder: Path) -> None:
    """Remove a folder of this process (the transport's ``close``) and forget it."""
    with _lock:
        _owned.discard(folder)
    shutil.rmtree(folder, ignore_errors=True)


def remove_all_owned() -> None:
    """Remove every folder this process still owns (at exit and on SIGTERM)."""
    with _lock:
        folders = list(_owned)
        _owned.clear()
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def remove_run_folders(run_id: str, parent: Path | None = None) -> list[Path]:
    """Remove every folder of run ``run_id`` under ``parent`` (whoever owns it); returns them."""
    base = parent if parent is not None else shm_parent() or Path(tempfile.gettempdir())
    tag = f"{folder_tag(run_id)}-"
    removed = []
    for folder in base.glob(f"{PREFIX}p*"):
        match = _OWNED.match(folder.name)
        if match and folder.name[match.end() :].startswith(tag) and folder.is_dir():
            removed.append(folder)
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
    return removed


def reclaim_orphaned_folders(parent: Path | None = None) -> list[Path]:
    """Remove the folders under ``parent`` whose owning process is gone; returns them.

    A folder whose owner lives (a concurrent run, this process) is kept.
    """
    base = parent if parent is not None else shm_parent() or Path(tempfile.gettempdir())
    reclaimed = []
    for folder in base.glob(f"{PREFIX}p*"):
        pid = owner_pid(folder)
        if pid is None or pid == os.getpid() or pid_alive(pid) or not folder.is_dir():
            continue
        shutil.rmtree(folder, ignore_errors=True)
        reclaimed.append(folder)
    return reclaimed


def _install_exit_hooks() -> None:
    """``atexit`` once per process, and a SIGTERM handler when on the main thread (signals need it)."""
    global _hooks_installed
    with _lock:
        if _hooks_installed:
            return
        _hooks_installed = True
    atexit.register(remove_all_owned)
    if threading.current_thread() is not threading.main_thread():
        return  # a Ray actor's method thread: Ray's own SIGTERM handler exits through atexit
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        remove_all_owned()
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:  # the default: die of SIGTERM, as without this handler
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    with contextlib.suppress(ValueError):  # an interpreter that does not allow it
        signal.signal(signal.SIGTERM, on_sigterm)
