"""The event loop the orchestrator runs on: uvloop's where it is installed, else asyncio's.

uvloop (a dependency of telescope-core except on Windows, where it does not build) is
a drop-in asyncio loop on libuv: the same API, less CPU per callback and socket
event. The orchestrator keeps hundreds of completion requests in flight, so its loop
is busy; on the CPU quick start's loop (``bench/bench_step_overheads.py --steps 150``)
the orchestrator's CPU per step went from 123 to 115 ms. The embedded inference
server gets the same loop, and httptools' HTTP parser, from uvicorn, which picks both
when they are installed.

:func:`run` is ``asyncio.run`` on that loop, with its semantics (a new loop, SIGINT
cancels the main task, async generators and the default executor are shut down).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor when uvloop is installed; None (asyncio's default loop) otherwise."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to completion on a new loop of :func:`loop_factory`'s kind (as ``asyncio.run``)."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coroutine)
