"""Timeline events: timed records of what happened (sandbox commands, forward passes, ...).

Any component emits an event with :func:`emit` or times a block with :func:`timed`;
sinks subscribed with :func:`subscribe` receive every event (the run store writes
them to its ``events/`` blocks; tests collect them in a list). With no sink subscribed an
event costs a dictionary and a lock, so emitting is safe on warm paths but should
not be done per token.

An event is a flat JSON-ready dict with at least ``kind`` (dotted, e.g.
``sandbox.execute``), ``start`` (UNIX seconds) and ``duration_s``; the rest is up
to the emitter (``sandbox_id``, ``exit_code``, ``step``, ...).

Ids that a whole stretch of work shares (the ``group_id``, ``sample_id`` and ``turn``
of a rollout) are set once with :func:`context`; :func:`emit` adds them to every event
emitted inside it (fields given to ``emit`` win). The context is a ``contextvars``
value, so it follows asyncio tasks and ``asyncio.to_thread`` calls (reward functions,
tool calls, sandbox commands) but not plain threads.

Events made in another process (a trainer rank) travel as dicts and are handed to
the sinks here with :func:`publish`.

A :func:`timed` block that has not ended yet is listed by :func:`open_blocks` (its
kind, fields, context and start): what the run is doing right now, which the
watchdog (:mod:`telescope.orchestrator.watchdog`) reports when nothing progresses.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Event = dict[str, Any]
Sink = Callable[[Event], None]

_lock = threading.Lock()
_sinks: list[Sink] = []
_open: dict[int, Event] = {}  # timed blocks in progress, by id of their field dict
_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "telescope_event_context", default=None
)


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
    event.update(_context.get() or {})
    event.update(fields)
    return publish(event)


def publish(event: Event) -> Event:
    """Hand a finished event dict (one made in another process, say) to every sink as it is."""
    with _lock:
        sinks = list(_sinks)
    for sink in sinks:
        with contextlib.suppress(Exception):  # an observer must never break the observed code
            sink(event)
    return event


def publish_worker_events(records: list[Event], **ids: Any) -> None:
    """Put records made in a worker process on this process's event bus.

    Each gets the fields of the current event context (the orchestrator's ``step``)
    under its own, and ``ids`` (``rank``, ``step``, ...) over them.
    """
    context = current_context()
    for record in records:
        publish({**context, **record, **ids})


@contextmanager
def context(**fields: Any) -> Iterator[None]:
    """Add ``fields`` to every event emitted inside the block (nested blocks add to the outer ones)."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def current_context() -> dict[str, Any]:
    """The fields :func:`context` blocks add here (a copy)."""
    return dict(_context.get() or {})


@contextmanager
def timed(kind: str, **fields: Any) -> Iterator[Event]:
    """Time a block and emit one event when it ends; the block may add fields to the dict.

    ``with timed("sandbox.execute", sandbox_id=sid) as ev: ...; ev["exit_code"] = 0``.
    An exception inside the block is recorded as ``error`` and re-raised.
    """
    extra: Event = dict(fields)
    start = time.time()
    t0 = time.perf_counter()
    key = id(extra)
    with _lock:
        _open[key] = {"kind": kind, "start": start, **(_context.get() or {}), **fields}
    try:
        yield extra
    except BaseException as exc:
        extra.setdefault("error", f"{type(exc).__name__}: {exc}")
        raise
    finally:
        with _lock:
            _open.pop(key, None)
        emit(kind, start=start, duration_s=time.perf_counter() - t0, **extra)


def open_blocks() -> list[Event]:
    """The :func:`timed` blocks of this process that have not ended, the oldest first (copies)."""
    with _lock:
        blocks = [dict(b) for b in _open.values()]
    return sorted(blocks, key=lambda b: float(b["start"]))
