"""Environment calls with a time limit run on reusable daemon workers (telescope.orchestrator.deadlines)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest

from telescope.orchestrator import deadlines
from telescope.orchestrator.deadlines import DaemonWorkers, call_with_deadline
from telescope.system.timeouts import OperationTimeout

TAG: contextvars.ContextVar[str] = contextvars.ContextVar("TAG", default="none")


def test_sequential_calls_reuse_one_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deadlines, "_workers", DaemonWorkers())  # no free workers left by earlier tests
    names: set[int] = set()

    async def main() -> None:
        for i in range(30):
            assert await call_with_deadline("reward", f"call {i}", 5.0, lambda x: x * 2, i) == 2 * i
            names.add(await call_with_deadline("reward", "ident", 5.0, threading.get_ident))

    asyncio.run(main())
    # one thread served all 60 calls (a thread per call would have started 60)
    assert deadlines._workers.threads_started == 1
    assert len(names) == 1
    assert names != {threading.get_ident()}  # and not on the event loop's thread


def test_concurrent_calls_each_get_a_worker_and_see_their_context() -> None:
    workers = DaemonWorkers(idle_exit_s=5.0)
    gate = threading.Barrier(6, timeout=5.0)
    seen: list[str] = []

    def job(tag: str) -> None:
        gate.wait()  # all six run at once, or the barrier times out
        seen.append(tag)

    for i in range(6):
        context = contextvars.copy_context()
        context.run(TAG.set, f"t{i}")
        workers.submit(lambda c=context: c.run(lambda: job(TAG.get())))
    deadline = time.monotonic() + 5
    while len(seen) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(seen) == [f"t{i}" for i in range(6)]
    assert workers.threads_started == 6


def test_a_hung_call_keeps_its_worker_and_the_next_call_gets_another() -> None:
    release = threading.Event()

    async def main() -> None:
        with pytest.raises(OperationTimeout, match=r"timeout/reward: hung did not finish within 0\.05 s"):
            await call_with_deadline("reward", "hung", 0.05, release.wait)
        # the hung call still holds its thread; this one runs anyway
        assert await call_with_deadline("reward", "after", 5.0, lambda: "ok") == "ok"
        assert any(c.what == "hung" for c in deadlines.running_calls())

    try:
        asyncio.run(main())
    finally:
        release.set()


def test_an_idle_worker_ends_and_a_later_call_starts_a_new_one() -> None:
    workers = DaemonWorkers(idle_exit_s=0.05, name="idle-test")
    done = threading.Event()
    workers.submit(done.set)
    assert done.wait(5.0)
    deadline = time.monotonic() + 5
    while any(t.name == "idle-test" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == "idle-test" for t in threading.enumerate())
    again = threading.Event()
    workers.submit(again.set)
    assert again.wait(5.0)
    assert workers.threads_started == 2


def test_an_error_reaches_the_caller() -> None:
    def fail() -> None:
        raise ValueError("bad reward")

    async def main() -> None:
        with pytest.raises(ValueError, match="bad reward"):
            await call_with_deadline("reward", "fails", 5.0, fail)
        assert await call_with_deadline("reward", "then", None, lambda: 3) == 3

    asyncio.run(main())
