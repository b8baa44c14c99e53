"""Timeline events: timed records of what happened (sandbox commands, forward passes, ...).

Any component emits an event with :func:`emit` or times a block with :func:`timed`;
sinks subscribed with :func:`subscribe` receive every event (the run store writes
them to ``events.jsonl``; tests collect them in a list). With no sink subscribed an
event costs a dictionary and a lock, so emitting is safe on warm paths but should
not be done per token.

An event is a flat JSON-ready dict with at least ``kind`` (dotted, e.g.
``sandbox.execute``), ``start`` (UNIX seconds) and ``duration_s``; the rest is up
to the emitter (``sandbox_id``, ``exit_code``, ``step``, ...).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Event = dict[str, Any]
Sink = Callable[[Event], None]

_lock = threading.Lock()
_sinks: list[Sink] = []


def subscribe(sink: Sink) -> Callable[[], None]:
    """Send every future event to ``sink``; returns a function that unsubscribes it."""
    with _lock:
        _sinks.append(sink)

    def unsubscribe() -> None:
        with _lock:
            if sink in _sinks:
                _sinks.remove(sink)

    return unsubscribe


def emit(kind: str, *, start: float | None = None, duration_s: float = 0.0, **fields: Any) -> Event:
    """Record one event and hand it to every sink (a failing sink is dropped from this call)."""
    event: Event = {"kind": kind, "start": time.time() if start is None else start, "duration_s": duration_s}
    event.update(fields)
    with _lock:
        sinks = list(_sinks)
    for sink in sinks:
        with contextlib.suppress(Exception):  # an observer must never break the observed code
            sink(event)
    return event


@contextmanager
def timed(kind: str, **fields: Any) -> Iterator[Event]:
    """Time a block and emit one event when it ends; the block may add fields to the dict.

    ``with timed("sandbox.execute", sandbox_id=sid) as ev: ...; ev["exit_code"] = 0``.
    An exception inside the block is recorded as ``error`` and re-raised.
    """
    extra: Event = dict(fields)
    start = time.time()
    t0 = time.perf_counter()
    try:
        yield extra
    except BaseException as exc:
        extra.setdefault("error", f"{type(exc).__name__}: {exc}")
        raise
    finally:
        emit(kind, start=start, duration_s=time.perf_counter() - t0, **extra)
