"""Stopping a run's Ray workers: one bounded wait for every graceful stop, then kills.

:func:`stop_workers` pings the trainer ranks together first. A rank that does not
answer within the ping timeout (stopped, or stuck holding its interpreter) gets no
``close``, which would only queue behind whatever holds it. The servers' ``stop`` and
the answering ranks' ``close`` calls are then sent together and awaited at most
``CLOSE_TIMEOUT_S`` in all, not per worker. Every actor is then killed, whether or not
its graceful stop returned. :func:`bounded` runs a cleanup in a daemon thread for at
most a given time, for a Ray whose processes may already be gone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import ray

log = logging.getLogger("telescope.run.workers")

#: Seconds the servers' stops and the trainer ranks' closes get, all together, at shutdown.
CLOSE_TIMEOUT_S = 30.0


def stop_workers(servers: Sequence[Any], trainers: Sequence[Any], others: Sequence[Any], ping_timeout_s: float) -> None:
    """Stop ``servers``, close the answering ``trainers``, then kill every actor (``others`` too)."""
    try:
        answering = _answering(trainers, ping_timeout_s)
        for rank, trainer in enumerate(trainers):
            if trainer not in answering:
                log.warning(
                    "trainer rank %d does not answer a ping within %g s: killed without closing it",
                    rank,
                    ping_timeout_s,
                )
        calls = [server.stop.remote() for server in servers] + [t.close.remote() for t in answering]
        if calls:
            ray.wait(calls, num_returns=len(calls), timeout=CLOSE_TIMEOUT_S)
    except Exception as exc:  # a dead Ray: the kills below still run
        log.debug("graceful stop of the workers failed: %s", exc)
    for actor in [*servers, *trainers, *others]:
        try:
            ray.kill(actor)
        except Exception as exc:  # already dead, or Ray gone
            log.debug("killing %s: %s", actor, exc)


def _answering(actors: Sequence[Any], timeout_s: float) -> list[Any]:
    """The trainer actors whose ping returns (a value or an error) within ``timeout_s``, pinged together."""
    if not actors:
        return []
    pings = [actor.ping.remote() for actor in actors]
    ready, _ = ray.wait(pings, num_returns=len(pings), timeout=timeout_s)
    done = set(ready)
    return [actor for actor, ping in zip(actors, pings, strict=True) if ping in done]


def bounded(seconds: float, function: Callable[[], Any]) -> bool:
    """Run ``function`` in a daemon thread and wait at most ``seconds`` for it (it may block on a dead Ray).

    Returns whether it finished in time; an exception it raises is logged, not raised.
    """

    def call() -> None:
        try:
            function()
        except Exception as exc:  # a cleanup of a Ray that is going away: nothing left to do about it
            log.debug("the Ray cleanup %s failed: %s", getattr(function, "__name__", function), exc)

    worker = threading.Thread(target=call, name="telescope-ray-cleanup", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        log.warning("the Ray cleanup did not finish within %.0f s (Ray's processes are gone); skipping it", seconds)
        return False
    return True
