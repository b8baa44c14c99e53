"""``bounded``: a cleanup that may block on a dead Ray gets at most its budget, and cannot raise."""

from __future__ import annotations

import threading

import pytest

from telescope.runtime.worker_shutdown import bounded


def test_a_cleanup_that_returns_in_time_is_reported_finished() -> None:
    calls: list[str] = []
    assert bounded(5.0, lambda: calls.append("ran")) is True
    assert calls == ["ran"]


@pytest.mark.timeout(60)  # a cleanup that is not abandoned hangs the test: fail it sooner
def test_a_blocked_cleanup_is_abandoned_after_its_budget() -> None:
    release = threading.Event()  # never set while bounded waits: only abandoning it lets the call return
    try:
        assert bounded(0.2, release.wait) is False
    finally:
        release.set()  # let the daemon thread end


def test_a_failing_cleanup_is_contained() -> None:
    def fail() -> None:
        raise ConnectionError("the GCS is gone")

    assert bounded(5.0, fail) is True
