"""Cleanup walks: what a private uid left in shared directories, and trees however deep or hostile."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from telescope_sandbox._cleanup import clear_dir, dir_size, force_remove, remove_owned

ROOT = os.geteuid() == 0
UID = 61_234
pytestmark = pytest.mark.skipif(not ROOT, reason="giving files to another uid needs root")


def _owned(path: Path, uid: int = UID) -> Path:
    path.write_text("x")
    os.chown(path, uid, uid)
    return path


def test_a_crowded_first_directory_does_not_hide_the_second(tmp_path: Path) -> None:
    """The CI host's /tmp held more entries than the walk's bound, and /dev/shm was never reached."""
    crowded, shm = tmp_path / "tmp", tmp_path / "shm"
    crowded.mkdir(mode=0o1777)
    shm.mkdir(mode=0o1777)
    os.chmod(crowded, 0o1777)
    os.chmod(shm, 0o1777)
    for i in range(50):
        (crowded / f"other-{i}").write_text("")
    left = _owned(shm / "left-behind")
    assert remove_owned(UID, [str(crowded), str(shm)], limit=10) == 1
    assert not left.exists()


def test_only_world_writable_directories_are_searched(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    private = shared / "private"  # another user's 0755 directory: the uid cannot write there
    private.mkdir()
    os.chmod(private, 0o755)
    open_dir = shared / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    mine_dir = shared / "mine"
    mine_dir.mkdir()
    _owned(mine_dir / "inner")
    os.chown(mine_dir, UID, UID)
    in_private = _owned(private / "not-searched")
    in_open = _owned(open_dir / "found")
    top_level = _owned(shared / "found-too")
    other = shared / "someone-else"
    other.write_text("keep")

    assert remove_owned(UID, [str(shared)]) == 3  # mine_dir (whole), open/found, found-too
    assert not mine_dir.exists() and not in_open.exists() and not top_level.exists()
    assert in_private.exists() and other.exists()


def _deep_tree(top: Path, depth: int) -> None:
    """``top/d/d/.../d/leaf``, ``depth`` levels (built by descriptor: the path outgrows PATH_MAX)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    leaf = os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(leaf, b"x" * 10000)
    os.close(leaf)
    os.close(fd)


@pytest.mark.slow
def test_a_tree_deeper_than_the_recursion_limit_and_path_max_is_sized_and_removed(tmp_path: Path) -> None:
    top = tmp_path / "top"
    top.mkdir()
    _deep_tree(top, 2500)  # 5,000 characters of path, 2.5 times Python's recursion limit
    blocks = os.lstat(top).st_blocks * 512
    assert dir_size(str(top)) >= 2501 * blocks + 10000
    clear_dir(str(top))
    assert os.listdir(top) == []


def test_links_are_removed_not_followed(tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "keep.txt").write_bytes(b"x" * 100_000)
    top = tmp_path / "top"
    (top / "sub").mkdir(parents=True)
    (top / "sub" / "to-host").symlink_to(host)
    (top / "to-file").symlink_to(host / "keep.txt")
    assert dir_size(str(top)) < 100_000  # the linked file is not counted
    force_remove(str(top))
    assert not top.exists() and (host / "keep.txt").read_bytes() == b"x" * 100_000


def test_directories_made_unreadable_are_emptied_without_root() -> None:
    """A sandbox without a private uid shares the host's uid and may ``chmod 0`` its directories."""
    top = Path(tempfile.mkdtemp())  # where the plain user can reach it
    os.chown(top, UID, UID)
    try:
        assert _clear_as_plain_user(top) == []
    finally:
        force_remove(str(top))


def _clear_as_plain_user(top: Path) -> object:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, as a plain user
        try:
            os.setgroups([])
            os.setgid(UID)
            os.setuid(UID)
            (top / "a" / "b").mkdir(parents=True)
            (top / "a" / "b" / "f").write_text("x")
            os.chmod(top / "a" / "b", 0)
            os.chmod(top / "a", 0o100)  # enter only: no listing, no removing
            clear_dir(str(top))
            os.write(write_fd, json.dumps(os.listdir(top)).encode())
        except BaseException as exc:
            os.write(write_fd, json.dumps(repr(exc)).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    with os.fdopen(read_fd) as f:
        return json.loads(f.read())
