"""The memory transport's shared-memory folders never outlive their run: real kills, then a look."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from telescope.api.context import TransportContext
from telescope.transports import shm_folders
from telescope.transports.memory import MemoryTransport

#: A sender in its own process: creates its folder under argv[1] for run argv[2], sends one
#: version, prints the folder, then waits (for a signal) or, with argv[3] == "exit", returns.
SENDER = """
import sys, time, torch
from telescope.api.context import TransportContext
from telescope.transports.memory import MemoryTransport
t = MemoryTransport(TransportContext(run_id=sys.argv[2]), parent=sys.argv[1])
print(t.prepare_sender(1)["root"], flush=True)
t.send([("w", torch.ones(4, 4))], version=0)
print("sent", flush=True)
if sys.argv[3] != "exit":
    time.sleep(600)
"""


def _start_sender(parent: Path, run_id: str, then: str = "wait") -> tuple[subprocess.Popen[str], Path]:
    process = subprocess.Popen(
        [sys.executable, "-c", SENDER, str(parent), run_id, then], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    root = Path(process.stdout.readline().strip())
    assert process.stdout.readline().strip() == "sent"
    return process, root


@pytest.mark.slow
def test_a_sigkilled_senders_folder_is_reclaimed_at_the_next_start_and_a_live_runs_folder_is_kept(
    tmp_path: Path,
) -> None:
    killed, killed_root = _start_sender(tmp_path, "run-a")
    alive, alive_root = _start_sender(tmp_path, "run-b")
    try:
        assert killed_root.name.startswith(f"telescope-weights-p{killed.pid}-run-a-")
        assert (killed_root / "region-0.bin").exists() and (alive_root / "region-0.bin").exists()
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert killed_root.is_dir()  # nothing of the dead process ran: the folder leaked

        next_start = MemoryTransport(TransportContext(run_id="run-c"), parent=tmp_path)
        own_root = Path(next_start.prepare_sender(1)["root"])
        assert not killed_root.exists()
        assert alive_root.is_dir() and (alive_root / "region-0.bin").exists()  # a live concurrent run
        next_start.close()
        assert not own_root.exists()
    finally:
        alive.kill()
        alive.wait(timeout=30)
    assert shm_folders.reclaim_orphaned_folders(tmp_path) == [alive_root]


@pytest.mark.slow
def test_a_sender_stopped_by_sigterm_removes_its_folder(tmp_path: Path) -> None:
    process, root = _start_sender(tmp_path, "run-a")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM  # it still dies of SIGTERM
    assert not root.exists()


@pytest.mark.slow
def test_a_sender_that_exits_without_closing_removes_its_folder(tmp_path: Path) -> None:
    process, root = _start_sender(tmp_path, "run-a", then="exit")
    assert process.wait(timeout=30) == 0
    assert not root.exists()


def test_the_driver_removes_every_folder_of_its_run_and_only_those(tmp_path: Path) -> None:
    mine = [shm_folders.create_owned_folder("run-a-1234", tmp_path) for _ in range(2)]
    other = shm_folders.create_owned_folder("x-run-a-1234", tmp_path)  # a run id that ends like this one
    unowned = tmp_path / "telescope-weights-legacy"
    unowned.mkdir()
    try:
        assert sorted(shm_folders.remove_run_folders("run-a-1234", tmp_path)) == sorted(mine)
        assert not any(f.exists() for f in mine) and other.is_dir() and unowned.is_dir()
    finally:
        shm_folders.remove_owned_folder(other)


def test_a_folder_of_a_dead_pid_is_reclaimed_one_of_a_live_pid_is_not(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    orphan = tmp_path / f"telescope-weights-p{dead_pid}-run-x-abc"
    live = tmp_path / f"telescope-weights-p{os.getppid()}-run-y-abc"
    legacy = tmp_path / "telescope-weights-abcdef"
    for folder in (orphan, live, legacy):
        folder.mkdir()
    assert shm_folders.reclaim_orphaned_folders(tmp_path) == [orphan]
    assert live.is_dir() and legacy.is_dir()


def test_the_folder_name_carries_a_run_id_that_is_safe_as_a_file_name(tmp_path: Path) -> None:
    transport = MemoryTransport(TransportContext(run_id="my run/1"), parent=tmp_path)
    root = Path(transport.prepare_sender(1)["root"])
    try:
        assert root.name.startswith(f"telescope-weights-p{os.getpid()}-my_run_1-")
        assert shm_folders.owner_pid(root) == os.getpid()
        transport.send([("w", torch.zeros(2))], version=0)
    finally:
        transport.close()
    assert not root.exists()
