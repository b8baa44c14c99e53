"""processes_mentioning finds a run's processes even under pytest's own temporary directories."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from telescope.testing.processes import leftovers_after, pid_of, processes_mentioning


def test_a_process_under_a_pytest_directory_is_found_and_the_caller_is_not(tmp_path: Path) -> None:
    assert "pytest" in str(tmp_path)  # pytest-of-<user>: what made the old filter blind
    marker = str(tmp_path / "run")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        # until the child has exec'd, its command line is still the parent's (CI once looked too soon)
        deadline = time.monotonic() + 20
        while not (found := processes_mentioning(marker)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [line.split(":", 1)[0] for line in found] == [str(child.pid)]
        assert pid_of(marker, "time.sleep") == child.pid
        with pytest.raises(LookupError, match="no live process"):
            pid_of(marker, "no-such-marker")
    finally:
        child.kill()
        child.wait()
    assert processes_mentioning(marker) == []


def test_the_calling_process_is_left_out() -> None:
    own_command = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")[0].decode()
    pids = [int(line.split(":", 1)[0]) for line in processes_mentioning(own_command)]
    assert os.getpid() not in pids


def test_leftovers_after_waits_for_a_process_that_is_stopping_and_reports_one_that_stays(tmp_path: Path) -> None:
    marker = str(tmp_path / "run")
    stopping = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)", marker])
    try:
        while not processes_mentioning(marker):
            time.sleep(0.05)
        assert leftovers_after(marker, timeout_s=20) == []
    finally:
        stopping.kill()
        stopping.wait()
    staying = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        while not processes_mentioning(marker):  # until it has exec'd (a fresh fork shows its parent's command)
            time.sleep(0.05)
        assert [line.split(":", 1)[0] for line in leftovers_after(marker, timeout_s=1)] == [str(staying.pid)]
    finally:
        staying.kill()
        staying.wait()
