"""A run whose status says ``running`` but whose process is gone reads as ``died``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from telescope.recording.run_liveness import run_state
from telescope.recording.run_reader import RunReader

#: A "driver": writes status running through the real run store, says so, then waits to be killed.
DRIVER = """
import sys, time
from telescope.recording.run_store import RunStore
RunStore(sys.argv[1]).set_status("running", step=3)
print("running", flush=True)
time.sleep(600)
"""


def test_a_driver_killed_by_sigkill_reads_as_died_while_a_live_one_reads_running(tmp_path: Path) -> None:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout is not None and driver.stdout.readline().strip() == "running"
        status = RunReader(tmp_path).status()
        assert status is not None and status["pid"] == driver.pid
        assert run_state(status).status == "running" and run_state(status).checked
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    status = RunReader(tmp_path).status()
    assert status is not None and status["status"] == "running"  # nothing recorded the end
    state = run_state(status)
    assert state.status == "died" and state.checked and str(driver.pid) in (state.detail or "")


def test_a_reused_pid_does_not_keep_a_dead_run_running() -> None:
    # this process lives, but it started after the status was last written: not the run's process
    status = {"status": "running", "pid": os.getpid(), "host": socket.gethostname(), "updated_time": 1000.0}
    assert run_state(status).status == "died"
    status["updated_time"] = time.time()
    assert run_state(status).status == "running"


def test_a_run_of_another_host_is_not_judged_and_says_so() -> None:
    status = {"status": "running", "pid": 999_999_999, "host": "elsewhere", "updated_time": time.time()}
    state = run_state(status, hostname="here")
    assert state.status == "running" and not state.checked and "elsewhere" in (state.detail or "")


def test_final_statuses_are_shown_as_recorded() -> None:
    for recorded in ("completed", "failed", "interrupted"):
        assert run_state({"status": recorded, "pid": 999_999_999, "host": socket.gethostname()}).status == recorded
    assert run_state(None).status == "unknown"
