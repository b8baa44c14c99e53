"""File cleanup for the local provider: sizes, emptying, and removing what a uid left.

A sandbox controls everything below its directories: it may nest them thousands of
levels deep (deeper than a path may be long), swap a directory for a symbolic link,
or make a directory unreadable (``chmod 0``; a host without root cannot empty it
without opening it up first). So the walks here

- are iterative (an explicit stack of names, never recursion) and address every entry
  relative to an open descriptor of its directory (never by a path, which could pass
  ``PATH_MAX`` or a link);
- hold one directory descriptor at a time: going back up opens ``..`` of the current
  one and checks it is the directory the walk came from (device and inode), so a tree
  moved under the walk stops it with an error instead of leading it elsewhere;
- never follow a symbolic link (a link is a leaf: counted, or unlinked) and never
  cross into another file system.

They expect nothing of the sandbox to run meanwhile (the provider holds its lock and
has killed every process); a tree that still changes is reported, not chased.

Without mount namespaces a sandbox may also leave files in the host's ``/tmp`` and
``/dev/shm``, found by owner (:func:`remove_owned`).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Collection
from dataclasses import dataclass, field

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TreeChangedError(OSError):
    """A directory moved while a walk was below it (something still runs there)."""


@dataclass
class _Level:
    """One directory of the current walk path: its identity and the entries left to visit."""

    fd: int  # -1 while a directory below it is open
    dev: int
    ino: int
    name: str  # its name in the directory above ("" for the top)
    names: list[str] = field(default_factory=list)


def _open_up(name: str, dir_fd: int | None) -> int:
    """Open directory ``name`` after giving its owner (this process) full access to it."""
    path_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.chmod(f"/proc/self/fd/{path_fd}", 0o700)  # the directory itself, never a link
    finally:
        os.close(path_fd)
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _open_dir(name: str, dir_fd: int | None, remove: bool) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        if not remove:
            raise
        return _open_up(name, dir_fd)


def _open_level(name: str, dir_fd: int | None, remove: bool, expect: os.stat_result | None) -> _Level:
    """Open directory ``name`` as a walk level (for ``remove``, with the access emptying it needs)."""
    fd = _open_dir(name, dir_fd, remove)
    try:
        now = os.fstat(fd)
        if expect is not None and (now.st_dev, now.st_ino) != (expect.st_dev, expect.st_ino):
            raise TreeChangedError(f"directory {name!r} was replaced during the walk")
        if remove and os.geteuid() != 0 and now.st_mode & 0o700 != 0o700:
            os.close(fd)
            fd = _open_up(name, dir_fd)  # entries of a directory without rwx cannot be removed
        return _Level(fd, now.st_dev, now.st_ino, name, os.listdir(fd))
    except BaseException:
        os.close(fd)
        raise


def _ascend(child: _Level, parent: _Level) -> None:
    fd = os.open("..", _DIR_FLAGS, dir_fd=child.fd)
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (parent.dev, parent.ino):
        os.close(fd)
        raise TreeChangedError(f"directory {child.name!r} was moved during the walk")
    parent.fd = fd
    os.close(child.fd)
    child.fd = -1


def _walk(top: str, remove: bool, errors: list[OSError]) -> int:
    """Bytes on disk below ``top`` (not ``top`` itself); with ``remove``, unlink them all.

    Entries that cannot be read (or removed) are skipped and their errors appended to
    ``errors``; a tree that changes under the walk raises :class:`TreeChangedError`.
    """
    levels = [_open_level(top, None, remove, None)]
    try:
        total = 0
        while levels:
            level = levels[-1]
            if not level.names:
                levels.pop()
                if not levels:
                    os.close(level.fd)
                    level.fd = -1
                    break
                parent = levels[-1]
                _ascend(level, parent)
                if remove:
                    try:
                        os.rmdir(level.name, dir_fd=parent.fd)
                    except FileNotFoundError:
                        pass
                    except OSError as exc:
                        errors.append(exc)
                continue
            name = level.names.pop()
            try:
                st = os.stat(name, dir_fd=level.fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as exc:
                errors.append(exc)
                continue
            total += st.st_blocks * 512
            if stat.S_ISDIR(st.st_mode) and st.st_dev == level.dev:
                try:
                    child = _open_level(name, level.fd, remove, st)
                except TreeChangedError:
                    raise
                except OSError as exc:
                    errors.append(exc)
                    continue
                os.close(level.fd)
                level.fd = -1
                levels.append(child)
            elif stat.S_ISDIR(st.st_mode):
                errors.append(OSError(f"{name!r} is on another file system (a mount point); left alone"))
            elif remove:
                try:
                    os.unlink(name, dir_fd=level.fd)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    errors.append(exc)
        return total
    finally:
        for level in levels:
            if level.fd >= 0:
                os.close(level.fd)


def dir_size(*paths: str) -> int:
    """Bytes on disk under ``paths``, however deep (links not followed, unreadable entries skipped)."""
    total = 0
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            total += os.lstat(path).st_blocks * 512
            total += _walk(path, remove=False, errors=[])
    return total


def clear_dir(path: str) -> None:
    """Remove everything inside directory ``path``, however deep; raise :class:`OSError` if anything is left.

    ``path`` itself must not be a link (its parents are the host's, so the caller
    chooses it); nothing below it is followed.
    """
    errors: list[OSError] = []
    _walk(path, remove=True, errors=errors)
    if errors:
        raise OSError(f"{len(errors)} entries under {path} could not be removed; first: {errors[0]}")


def force_remove(path: str) -> None:
    """Remove ``path`` (a file, a link, or a tree however deep); raise :class:`OSError` if anything is left."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        clear_dir(path)
        os.rmdir(path)
    else:
        os.unlink(path)


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
                    with contextlib.suppress(OSError):
                        force_remove(full)
                        removed += 1
                elif name in dirs and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH:
                    keep.append(name)
            dirs[:] = keep
            if seen > limit:
                break
    return removed
