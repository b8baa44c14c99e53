"""remove_owned: what a private uid left in shared directories, found by owner."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from telescope_sandbox._cleanup import remove_owned

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
