"""Time limits on environment code: a reward function or an environment step that hangs.

Environment code (``initial_state``, ``compute_reward``, ``env_response``, ``is_done``)
is synchronous and runs off the event loop. :func:`call_with_deadline` runs one call in a thread
and gives up waiting after ``timeout_s``: it raises :class:`OperationTimeout`, which
:func:`~telescope.orchestrator.rollouts.run_rollout` turns into an errored rollout
(reward 0, counted in the step's ``timeouts/<kind>/count``), and the run goes on.

A Python thread cannot be killed, so the call keeps running in the background
until it returns by itself (if ever). That is why these calls do not use the event
loop's default executor (``asyncio.to_thread``): a hung call would hold one of its
few workers for good, and its non-daemon threads would keep the process from
exiting. They run on :class:`DaemonWorkers` instead: daemon threads that take calls
one after another, a new thread started only when none is free, so a thread stuck
in a hung call is simply left to it (starting a thread per call cost the event loop
a thread start and a wait for it, at every reward: 15% of the orchestrator's CPU
samples on the CPU quick start). At most :data:`MAX_CONCURRENT_CALLS` calls run at
a time (the default executor's size, so the concurrency is what it was); a call that
timed out gives its place back at once. A worker idle for
:attr:`DaemonWorkers.idle_exit_s` ends.

The calls still running are listed by :func:`running_calls` (the watchdog names
them when a run stops progressing). Request timeouts of inference servers
(``inference_request_timeout_s``) are the third kind of timeout counted per step;
they are raised by :class:`~telescope.inference.generation.ServerPool`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from telescope.system.timeouts import TIMEOUT_PREFIX, OperationTimeout

T = TypeVar("T")

#: The kinds of timeout a rollout can end with (``timeouts/<kind>/count`` in the step metrics).
TIMEOUT_KINDS = ("reward", "environment_step", "inference_request")

#: Environment calls running at once (as many as ``asyncio.to_thread``'s default executor has workers).
MAX_CONCURRENT_CALLS = min(32, (os.cpu_count() or 1) + 4)


def timeout_kind(error: str | None) -> str | None:
    """The kind of timeout an error message records (``reward``, ...), or None if it is no timeout."""
    if not error or not error.startswith(TIMEOUT_PREFIX):
        return None
    kind = error[len(TIMEOUT_PREFIX) :].split(":", 1)[0]
    return kind if kind in TIMEOUT_KINDS else None


def timeout_metrics(errors: Iterable[str | None]) -> dict[str, float]:
    """``timeouts/<kind>/count`` for every kind (0 included, so charts are continuous)."""
    counts = dict.fromkeys(TIMEOUT_KINDS, 0)
    for error in errors:
        kind = timeout_kind(error)
        if kind is not None:
            counts[kind] += 1
    return {f"timeouts/{kind}/count": float(n) for kind, n in counts.items()}


@dataclass(frozen=True)
class RunningCall:
    """An environment call in progress (for the watchdog's report)."""

    kind: str
    what: str
    started: float  # time.monotonic()
    context: dict[str, Any]
    loop: asyncio.AbstractEventLoop | None = None  # the event loop that waits (or waited) for it

    @property
    def age_s(self) -> float:
        return time.monotonic() - self.started


class DaemonWorkers:
    """Daemon threads that run submitted callables one after another (see the module docstring).

    ``submit`` hands the callable to a free worker, or starts a new one when every
    worker is busy (a hung call keeps its worker; the others go on). ``then`` runs
    after the worker counts itself free again, so a caller woken by it that submits
    its next call at once finds that worker free. Neither may raise
    (``call_with_deadline``'s catch everything).
    """

    def __init__(self, idle_exit_s: float = 30.0, name: str = "telescope-environment") -> None:
        self.idle_exit_s = idle_exit_s
        self.name = name
        self.threads_started = 0
        self._work: queue.SimpleQueue[tuple[Callable[[], None], Callable[[], None]]] = queue.SimpleQueue()
        self._free = 0  # workers waiting for work that no submitted call has claimed yet
        self._lock = threading.Lock()

    def submit(self, work: Callable[[], None], then: Callable[[], None] = lambda: None) -> None:
        with self._lock:
            start = self._free == 0
            if not start:
                self._free -= 1  # this call claims one waiting worker
            else:
                self.threads_started += 1
        self._work.put((work, then))
        if start:
            threading.Thread(target=self._serve, name=self.name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                work, then = self._work.get(timeout=self.idle_exit_s)
            except queue.Empty:
                with self._lock:
                    if self._free > 0:  # unclaimed: nobody counts on this worker, it may end
                        self._free -= 1
                        return
                continue  # claimed by a call whose work is on its way
            work()
            with self._lock:
                self._free += 1
            then()


_workers = DaemonWorkers()
_ids = itertools.count()
_running: dict[int, RunningCall] = {}
_running_lock = threading.Lock()
_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def running_calls(loop: asyncio.AbstractEventLoop | None = None) -> list[RunningCall]:
    """Environment calls in progress (of ``loop``'s run if given), the oldest first, timed-out ones included."""
    with _running_lock:
        calls = [c for c in _running.values() if loop is None or c.loop is loop]
    return sorted(calls, key=lambda c: c.started)


def _gate() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = asyncio.Semaphore(MAX_CONCURRENT_CALLS)
    return gate


async def call_with_deadline(
    kind: str, what: str, timeout_s: float | None, function: Callable[..., T], *args: Any
) -> T:
    """``function(*args)`` in a daemon thread; :class:`OperationTimeout` after ``timeout_s`` (None: no limit).

    The call sees the caller's context variables (the event context: ``group_id``,
    ``sample_id``, ...), as with ``asyncio.to_thread``. Cancelling the caller stops
    the waiting, not the call.
    """
    from telescope.api.events import current_context

    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()
    call_id = next(_ids)

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    outcome: list[tuple[T | None, BaseException | None]] = []

    def work() -> None:
        try:
            outcome.append((context.run(function, *args), None))
        except BaseException as exc:  # handed to the awaiting coroutine
            outcome.append((None, exc))
        finally:
            with _running_lock:
                _running.pop(call_id, None)

    def then() -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(settle, *outcome[0])

    gate = _gate()
    async with gate:
        with _running_lock:
            _running[call_id] = RunningCall(kind, what, time.monotonic(), current_context(), loop)
        _workers.submit(work, then)
        try:
            if timeout_s is None:
                return await asyncio.shield(future)
            try:
                async with asyncio.timeout(timeout_s):  # not wait_for, which can lose a cancellation on 3.11
                    return await asyncio.shield(future)
            except TimeoutError:
                if future.done() and not future.cancelled():  # finished (or raised) at the last moment
                    return future.result()
                raise OperationTimeout(kind, what, timeout_s) from None
        finally:
            if not future.done():  # timed out or cancelled: the thread's outcome is not wanted
                future.cancel()
