"""File cleanup for the local provider: sizes, emptying, and removing what a uid left.

A sandbox's processes may leave directories they made unreadable (``chmod 0``) - a host
without root cannot empty those without opening them up first - and, on a host without
mount namespaces, files in the host's ``/tmp`` and ``/dev/shm``, found by owner.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Collection


def dir_size(*paths: str) -> int:
    """Bytes on disk under ``paths`` (symbolic links not followed)."""
    total = 0
    for path in paths:
        for root, dirs, files in os.walk(path, onerror=lambda e: None):
            for name in files + dirs:
                try:
                    total += os.lstat(os.path.join(root, name)).st_blocks * 512
                except OSError:
                    continue
    return total


def clear_dir(path: str) -> None:
    """Remove everything inside ``path`` (even entries the sandbox made unreadable)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(path):
            force_remove(os.path.join(path, name))


def force_remove(path: str) -> None:
    try:
        st = os.lstat(path)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    # Without root, a directory made unreadable (chmod 0) must be opened up before emptying.
    for root, dirs, _files in os.walk(path, onerror=lambda e: None):
        for name in dirs:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                with contextlib.suppress(OSError):
                    os.chmod(full, 0o700)
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def remove_owned(uid: int, tops: Collection[str], limit: int = 100_000) -> int:
    """Remove what ``uid`` owns under ``tops`` (without a private /tmp); returns the count.

    A private uid (no groups of its own) can create entries only in directories that
    are writable by others (``/tmp``, ``/dev/shm``, and world-writable directories
    below them) or that it owns (removed whole). The walk therefore descends only into
    world-writable directories: a host ``/tmp`` with a million entries of other users
    costs a listing of the shared directories, not a full walk. ``limit`` bounds the
    entries looked at under each top.
    """
    removed = 0
    for top in tops:
        seen = 0
        for root, dirs, files in os.walk(top, onerror=lambda e: None):
            keep: list[str] = []
            for name in list(dirs) + files:
                seen += 1
                full = os.path.join(root, name)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                if st.st_uid == uid:
                    force_remove(full)
                    removed += 1
                elif name in dirs and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH:
                    keep.append(name)
            dirs[:] = keep
            if seen > limit:
                break
    return removed
