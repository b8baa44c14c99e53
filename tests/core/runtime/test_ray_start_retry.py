"""A private Ray cluster whose node does not register in time is started again (Ray waits a fixed 30 s).

``ray.init`` is replaced: each failing attempt starts a process (standing in for the GCS and
raylet Ray leaves running) and raises Ray's own message; the retry must stop those processes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from telescope.config.loader import load_config
from telescope.runtime import ray_cluster
from telescope.runtime.ray_cluster import PRIVATE_START_ATTEMPTS, RayStartError, connect_ray

RAY_TIMEOUT = (
    "The current node timed out during startup. This could happen because some of the raylet failed to "
    "startup or the GCS has become overloaded."
)


def private_config() -> Any:
    overrides = {"environments": [{"name": "countdown"}], "ray_address": "local"}
    return load_config(None, overrides, check_plugins=False).config


class FlakyInit:
    """Fails ``failures`` times as Ray does (leaving a process behind), then succeeds."""

    def __init__(self, failures: int, message: str = RAY_TIMEOUT) -> None:
        self.failures = failures
        self.message = message
        self.calls = 0
        self.left_behind: list[subprocess.Popen[bytes]] = []

    def __call__(self, **kwargs: Any) -> None:
        self.calls += 1
        assert kwargs["address"] == "local"
        if self.calls <= self.failures:
            self.left_behind.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]))
            raise Exception(self.message)


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(failures: int, message: str = RAY_TIMEOUT) -> FlakyInit:
        fake = FlakyInit(failures, message)
        monkeypatch.setattr(ray_cluster.ray, "init", fake)
        monkeypatch.setattr(ray_cluster.ray, "is_initialized", lambda: False)
        monkeypatch.setattr(ray_cluster.ray, "shutdown", lambda: None)
        return fake

    yield install


def test_a_node_that_registers_late_is_started_again_and_the_failed_attempts_processes_stopped(
    flaky: Any, tmp_path: Path
) -> None:
    fake = flaky(failures=2)
    assert connect_ray(private_config(), tmp_path) is True
    assert fake.calls == 3
    for process in fake.left_behind:
        assert process.wait(timeout=10) is not None  # terminated, not left running


def test_every_attempt_timing_out_is_a_clear_start_error(flaky: Any, tmp_path: Path) -> None:
    fake = flaky(failures=PRIVATE_START_ATTEMPTS)
    with pytest.raises(RayStartError, match=r"did not register .* 3 times .* overloaded"):
        connect_ray(private_config(), tmp_path)
    assert fake.calls == PRIVATE_START_ATTEMPTS
    assert all(process.poll() is not None for process in fake.left_behind)


def test_another_start_error_is_not_retried(flaky: Any, tmp_path: Path) -> None:
    fake = flaky(failures=1, message="port 6379 is in use")
    with pytest.raises(Exception, match="port 6379"):
        connect_ray(private_config(), tmp_path)
    assert fake.calls == 1
    fake.left_behind[0].kill()
