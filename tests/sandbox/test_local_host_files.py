"""The host's own file work on a local sandbox, against code that attacks it (issue 40 point 6).

Sandboxed code controls everything below its directories. Each test lets it do one
thing that broke the host before: nest directories 3,000 levels deep (past Python's
recursion limit and ``PATH_MAX``), swap a directory for a symbolic link to a
root-only host directory while the host uploads and downloads through it, swap its
``.tmp`` for a link before a reset, or leave a FIFO to download. The host directory
the links point at is checked byte for byte (entries, owners, modes, contents)
afterwards.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from telescope.api.sandbox import SandboxError, SandboxLimits
from telescope_sandbox import SandboxPool
from telescope_sandbox._cleanup import force_remove
from telescope_sandbox.local import LocalProvider, LocalSandbox

ROOT = os.geteuid() == 0
DEPTH = 3000
#: 3,000 directories take 3,000 blocks (about 11.7 MB on a 4 KiB-block file system).
LIMITS = SandboxLimits(memory_mb=256, disk_mb=64, timeout_s=60, max_processes=32)
DEEP = f"import os\nfor _ in range({DEPTH}):\n    os.mkdir('d')\n    os.chdir('d')\nopen('leaf', 'w').write('x')\n"


@pytest.fixture
def sandbox() -> Iterator[LocalSandbox]:
    sb = LocalProvider().create(LIMITS)
    yield sb
    sb.destroy()


def _snapshot(top: Path) -> dict[str, tuple[int, int, int, bytes]]:
    """Every entry below ``top`` (and ``top``): owner, group, mode and, for files, content."""
    seen = {}
    for path in [top, *sorted(top.rglob("*"))]:
        st = path.lstat()
        data = path.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        seen[str(path.relative_to(top))] = (st.st_uid, st.st_gid, st.st_mode, data)
    return seen


@pytest.fixture
def host_dir(tmp_path: Path) -> Path:
    """A host directory only its owner may enter, with a secret file and a subdirectory."""
    target = tmp_path / "host-only"
    (target / "x").mkdir(parents=True)
    (target / "f.txt").write_bytes(b"HOST SECRET")
    (target / "x" / "f.txt").write_bytes(b"HOST SECRET TOO")
    os.chmod(target / "x", 0o700)
    os.chmod(target, 0o700)
    return target


# ------------------------------------------------------------ deep trees
@pytest.mark.slow
def test_a_3000_level_tree_is_counted_against_the_disk_limit() -> None:
    sandbox = LocalProvider().create(SandboxLimits(memory_mb=256, disk_mb=4, timeout_s=60))
    try:
        result = sandbox.execute(["python3", "-c", DEEP])
        blocks = os.lstat(sandbox.workdir).st_blksize  # a directory takes at least one block
        assert result.resource_usage["disk_mb"] >= DEPTH * blocks / (1 << 20) * 0.9, result.resource_usage
        assert result.exit_code != 0 and "disk limit exceeded" in result.stderr and sandbox.dirty
    finally:
        sandbox.destroy()
    assert not os.path.exists(os.path.dirname(sandbox.workdir))


@pytest.mark.slow
def test_a_3000_level_tree_is_removed_by_reset_and_destroy(sandbox: LocalSandbox) -> None:
    # one in its working directory, one in its /tmp (its own directory, or the host's)
    made = sandbox.execute(["python3", "-c", DEEP + "os.chdir('/tmp')\n" + DEEP.replace("'d'", "'deep-tmp'")])
    assert made.exit_code == 0, made.stderr
    sandbox.reset()
    assert sorted(os.listdir(sandbox.workdir)) == [".tmp"]
    assert sandbox.execute("ls -A /tmp | grep -c deep-tmp").stdout.strip() == "0"
    again = sandbox.execute(["python3", "-c", DEEP])
    assert again.exit_code == 0, again.stderr
    root = os.path.dirname(sandbox.workdir)
    sandbox.destroy()
    assert not os.path.exists(root)


# ----------------------------------------------------- links swapped in a race
_SWAPPER = """
import os, shutil, sys, time
target, seconds = sys.argv[1], float(sys.argv[2])
open('swapping', 'w').close()
end = time.monotonic() + seconds
swaps = 0
while time.monotonic() < end and not os.path.exists('stop'):
    try:  # the host creates 'd' too, whenever an upload finds it missing
        if os.path.islink('d'):
            os.unlink('d')
            os.makedirs('d/x', exist_ok=True)
            open('d/f.txt', 'w').write('sandbox file')
        else:
            os.rename('d', f'gone{swaps}')
            os.symlink(target, 'd')
            swaps += 1
    except OSError:
        pass
    shutil.rmtree(f'gone{swaps - 1}', ignore_errors=True)
print(swaps)
"""


#: Transfers refused because they met the swapped-in link, at least, before the race stops.
RACES_MET = 50


@pytest.mark.slow
def test_transfers_racing_a_symlink_swap_never_touch_the_host(sandbox: LocalSandbox, host_dir: Path) -> None:
    before = _snapshot(host_dir)
    sandbox.upload("d/x/f.txt", b"first")
    results: list[Any] = []
    runner = threading.Thread(
        target=lambda: results.append(sandbox.execute(["python3", "-c", _SWAPPER, str(host_dir), "240"], timeout_s=250))
    )
    runner.start()
    try:
        while not os.path.exists(os.path.join(sandbox.workdir, "swapping")) and runner.is_alive():
            time.sleep(0.01)
        read: list[bytes] = []
        refused = 0
        # Enough rounds, and enough of them meeting the link: counted, not timed, so a loaded machine (the
        # swapper starved of CPU) takes longer instead of failing; the swapper's own limit ends a stuck race.
        i = 0
        while (i < 2000 or refused < RACES_MET) and runner.is_alive():
            i += 1
            for op in (
                partial(sandbox.upload, "d/x/f.txt", b"host wrote %d" % i),
                partial(sandbox.upload, "d/new/deeper/f.txt", b"host wrote"),
                partial(sandbox.download, "d/f.txt"),
                partial(sandbox.download, "d/x/f.txt"),
            ):
                try:
                    out = op()
                except SandboxError:
                    refused += 1
                else:
                    read.append(out or b"")
    finally:
        sandbox.upload("stop", b"")
        runner.join()
    assert results and results[0].exit_code == 0, results
    assert int(results[0].stdout) >= 2 and refused >= RACES_MET  # the race was on: transfers met the link
    assert not any(b"HOST SECRET" in data for data in read)
    assert _snapshot(host_dir) == before


def test_a_link_in_an_upload_path_is_refused_not_followed(sandbox: LocalSandbox, host_dir: Path) -> None:
    before = _snapshot(host_dir)
    sandbox.execute(["ln", "-s", str(host_dir), "d"])
    for path in ("d/x/f.txt", "d/new.txt", "d/new/f.txt"):
        with pytest.raises(SandboxError, match="symbolic link"):
            sandbox.upload(path, b"host wrote")
    with pytest.raises(SandboxError, match="outside the sandbox"):
        sandbox.download("d/f.txt")
    assert _snapshot(host_dir) == before


def test_uploads_belong_to_the_sandbox_user(sandbox: LocalSandbox) -> None:
    sandbox.upload("a/b/c.txt", b"data")
    sandbox.upload("a/b/c.txt", b"replaced")  # a new file, not a write into the old inode
    assert sandbox.download("a/b/c.txt") == b"replaced"
    owner = os.getuid() if sandbox.uid is None else sandbox.uid
    for rel in ("a", "a/b", "a/b/c.txt"):
        assert os.lstat(os.path.join(sandbox.workdir, rel)).st_uid == owner
    assert os.listdir(os.path.join(os.path.dirname(sandbox.workdir), "stage")) == []


@pytest.mark.skipif(not ROOT, reason="a file of another user in the sandbox needs a private uid (root host)")
def test_download_refuses_a_file_the_sandbox_user_does_not_own(sandbox: LocalSandbox) -> None:
    # what a hard link to a host file would look like: the inode keeps its owner
    with open(os.path.join(sandbox.workdir, "host.txt"), "wb") as f:
        f.write(b"HOST SECRET")
    with pytest.raises(SandboxError, match="does not belong to the sandbox's user"):
        sandbox.download("host.txt")


def test_download_of_a_fifo_is_refused_without_blocking(sandbox: LocalSandbox) -> None:
    assert sandbox.execute("mkfifo pipe").exit_code == 0
    with pytest.raises(SandboxError, match="not a regular file"):
        sandbox.download("pipe")


def test_reset_does_not_follow_a_swapped_tmpdir(sandbox: LocalSandbox, host_dir: Path) -> None:
    before = _snapshot(host_dir)
    assert sandbox.execute(["sh", "-c", f"rm -rf .tmp && ln -s {host_dir} .tmp"]).exit_code == 0
    sandbox.reset()
    assert _snapshot(host_dir) == before
    tmpdir = os.path.join(sandbox.workdir, ".tmp")
    assert stat.S_ISDIR(os.lstat(tmpdir).st_mode)
    assert sandbox.execute('touch "$TMPDIR/ok" && ls "$TMPDIR"').stdout.strip() == "ok"


# ------------------------------------------------ cleanup beside a command
def test_reset_waits_for_the_running_command(sandbox: LocalSandbox) -> None:
    results: list[Any] = []
    runner = threading.Thread(
        target=lambda: results.append(sandbox.execute("touch started; sleep 1; mkdir -p late/x; touch late/x/f"))
    )
    runner.start()
    try:
        while not os.path.exists(os.path.join(sandbox.workdir, "started")) and runner.is_alive():
            time.sleep(0.01)
        sandbox.reset()  # after the command, never under it
        assert results and results[0].exit_code == 0
        assert sorted(os.listdir(sandbox.workdir)) == [".tmp"]
    finally:
        runner.join()


def test_destroy_during_a_command_kills_it_and_removes_everything(sandbox: LocalSandbox) -> None:
    if sandbox.uid is None and not sandbox.protections["pid_isolated"]:
        pytest.skip("without a private uid or a PID namespace the host cannot kill a running command")
    results: list[Any] = []
    runner = threading.Thread(target=lambda: results.append(sandbox.execute("touch started; sleep 30")))
    runner.start()
    try:
        while not os.path.exists(os.path.join(sandbox.workdir, "started")) and runner.is_alive():
            time.sleep(0.01)
        sandbox.destroy()
        assert results and results[0].exit_code != 0
        assert not os.path.exists(os.path.dirname(sandbox.workdir))
    finally:
        runner.join()


def test_a_link_left_in_its_tmp_does_not_make_the_launcher_create_host_directories(
    sandbox: LocalSandbox, host_dir: Path
) -> None:
    """A working directory under /tmp is re-created as a mount point inside the sandbox's own /tmp."""
    root = os.path.dirname(sandbox.workdir)
    if not sandbox.tmp_isolated or not root.startswith("/tmp/"):
        pytest.skip("the working directory is re-created only under a private /tmp")
    before = _snapshot(host_dir)
    # inside its namespace /tmp is its own, but the host's /proc still leads to the host's /tmp
    link = f"/proc/{os.getpid()}/root{host_dir}"
    swap = sandbox.execute(["sh", "-c", f"mv {root} /tmp/moved-away && ln -s {link} {root}"])
    assert swap.exit_code == 0, swap.stderr
    after = sandbox.execute("echo ran")  # refused (fail closed) or run: either way nothing made on the host
    assert after.exit_code != 0 or after.stdout.strip() == "ran"
    assert _snapshot(host_dir) == before


def _immutable(path: str, on: bool) -> bool:
    """``chattr +i`` (or ``-i``) ``path``; whether it worked (root, and a file system that has it)."""
    chattr = shutil.which("chattr")
    flag = "+i" if on else "-i"
    return bool(ROOT and chattr) and subprocess.run([str(chattr), flag, path], capture_output=True).returncode == 0


def test_a_reset_that_leaves_files_raises_and_the_pool_replaces_the_sandbox() -> None:
    with SandboxPool(LocalProvider(), size=1, limits=LIMITS) as pool:
        with pool.acquire() as sb:
            sb.execute("mkdir -p keep && echo x > keep/stuck")
            first = sb.sandbox_id
            stuck = os.path.join(sb.inner.workdir, "keep", "stuck")  # type: ignore[attr-defined]
            if not _immutable(stuck, True):
                pytest.skip("cannot make a file unremovable here (needs root and chattr)")
        try:
            assert pool.reset_failures == 1 and pool.destroy_failures == 1  # the destroy fails too
            with pool.acquire() as sb:
                assert sb.sandbox_id != first
        finally:
            _immutable(stuck, False)
    root = os.path.dirname(os.path.dirname(os.path.dirname(stuck)))
    force_remove(root)
