"""The orchestrator's periodic infrastructure collection: one place, contained failures.

:class:`InfraMonitor` runs one asyncio task per :class:`Collector` in the
orchestrator's event loop. Every ``interval_s`` a collector's ``collect()``
returns ready-made event dicts (``kind``, ``start``, ``duration_s`` and fields),
which the monitor hands to :mod:`telescope.api.events` (so they reach the
run store, and any other sink, like every other timeline event). What is collected
is up to the collectors; the run's are built by :mod:`telescope.runtime.monitoring`
(drain the node samplers: ``infra.system``; drain the trainer ranks:
``infra.torch_memory``; scrape each inference server: ``infra.inference``).

Containment: a collector that raises or exceeds its ``timeout_s`` is logged (a
warning the first time and when it recovers, debug level in between, so a dead
server does not flood the log) and tried again at its next tick; it never stops
the other collectors or the run. :meth:`InfraMonitor.stop` cancels the tasks and,
by default, collects once more from each collector so samples still buffered
remotely are not lost.

:class:`InferenceMetricsScraper` turns successive ``/metrics`` scrapes of one
server (vLLM or the embedded engine, which exposes the same names) into
``infra.inference`` events: gauges as they are, and over the interval since the
previous scrape the token rates (``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``), the prefix-cache hit rate and the mean time to
first token and inter-token latency (from the histograms' ``_sum`` and ``_count``).
A counter that went down (a restarted server) gives no rate for that interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from telescope.api import events

log = logging.getLogger(__name__)

Event = dict[str, Any]


def publish(event: Mapping[str, Any]) -> None:
    """Hand a ready-made event dict to the event bus (``kind``, ``start``, ``duration_s``, fields)."""
    fields = dict(event)
    kind = str(fields.pop("kind"))
    start = fields.pop("start", None)
    duration = float(fields.pop("duration_s", 0.0))
    events.emit(kind, start=start, duration_s=duration, **fields)


@dataclass
class Collector:
    """``collect()`` every ``interval_s`` seconds; it returns the events to publish."""

    name: str
    interval_s: float
    collect: Callable[[], Awaitable[Iterable[Event]]]
    timeout_s: float = 30.0


class InfraMonitor:
    """Runs the collectors (see the module docstring). Start and stop it inside the event loop."""

    def __init__(
        self, collectors: Sequence[Collector], publish_event: Callable[[Mapping[str, Any]], None] = publish
    ) -> None:
        self.collectors = list(collectors)
        self.publish_event = publish_event
        self.failures: dict[str, int] = {c.name: 0 for c in self.collectors}
        self.published: dict[str, int] = {c.name: 0 for c in self.collectors}
        self._failing: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    def start(self) -> InfraMonitor:
        """Start one task per collector in the running event loop (first collection after one interval)."""
        if not self._tasks:
            self._stopping = False
            self._tasks = [asyncio.create_task(self._run(c), name=f"telescope-infra-{c.name}") for c in self.collectors]
            if self.collectors:
                log.info("infra monitor: %s", ", ".join(f"{c.name} every {c.interval_s:g} s" for c in self.collectors))
        return self

    async def stop(self, flush: bool = True, flush_timeout_s: float = 5.0) -> None:
        """Cancel the tasks; with ``flush``, collect once more from each collector (failures logged at debug).

        Bounded: a task is also told to stop by a flag, and waited for at most
        ``flush_timeout_s``. A collector that ignores a cancellation (a thread it
        waits on, say) would otherwise keep its task collecting while ``stop`` waits
        for it forever. (Collections are bounded with ``asyncio.timeout``, not
        ``wait_for``, which on Python 3.11 loses a cancellation that arrives as the
        collection completes.)
        """
        self._stopping = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=flush_timeout_s)
            for task in pending:  # cancelled again: it missed the first (see above)
                task.cancel()
            for task in tasks:
                if task.done() and not task.cancelled():
                    with contextlib.suppress(Exception):
                        task.result()  # retrieved, so asyncio does not warn
        if flush and tasks:
            flushes = (self.collect_once(c, timeout_s=flush_timeout_s, quiet=True) for c in self.collectors)
            await asyncio.gather(*flushes)

    async def collect_once(self, collector: Collector, *, timeout_s: float | None = None, quiet: bool = False) -> int:
        """One collection: publish its events; returns their number (0 after a contained failure)."""
        try:
            async with asyncio.timeout(timeout_s or collector.timeout_s):
                produced = await collector.collect()
            batch = list(produced)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._failed(collector, exc, quiet)
            return 0
        if collector.name in self._failing:
            self._failing.discard(collector.name)
            log.info("infra monitor: %s works again", collector.name)
        count = 0
        for event in batch:
            try:
                self.publish_event(event)
                count += 1
            except Exception as exc:
                log.debug("infra monitor: %s produced an event that could not be published: %s", collector.name, exc)
        self.published[collector.name] = self.published.get(collector.name, 0) + count
        return count

    def _failed(self, collector: Collector, exc: BaseException, quiet: bool) -> None:
        self.failures[collector.name] = self.failures.get(collector.name, 0) + 1
        reason = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
        if collector.name in self._failing or quiet:
            log.debug("infra monitor: %s failed again: %s", collector.name, reason)
            return
        self._failing.add(collector.name)
        log.warning(
            "infra monitor: collecting %s failed (%s); retrying every %g s, the run goes on",
            collector.name,
            reason,
            collector.interval_s,
        )

    async def _run(self, collector: Collector) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time() + collector.interval_s
        while not self._stopping:
            await asyncio.sleep(max(0.0, next_tick - loop.time()))
            if self._stopping:
                return
            await self.collect_once(collector)
            next_tick += collector.interval_s
            if next_tick < loop.time():  # a slow collection: skip the missed ticks
                next_tick = loop.time() + collector.interval_s


# ------------------------------------------------------------------ inference

#: Gauges copied into infra.inference events: event field <- Prometheus sample names (first present wins).
GAUGES: dict[str, tuple[str, ...]] = {
    "requests_running": ("vllm:num_requests_running",),
    "requests_waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),  # the latter: vLLM < 0.10
}
#: Counters reported as totals and, per second, as rates.
RATES: dict[str, str] = {
    "prompt_tokens": "vllm:prompt_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
}
#: Histograms reported as their mean over the interval.
MEANS: dict[str, str] = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}


class InferenceMetricsScraper:
    """Scrape one server's ``/metrics`` (``fetch``) into ``infra.inference`` events (see the module docstring).

    Fields: ``requests_running``, ``requests_waiting``, ``kv_cache_usage`` (0..1),
    ``prompt_tokens_total``, ``generation_tokens_total``, ``prompt_tokens_per_s``,
    ``generation_tokens_per_s``, ``prefix_cache_queries_total``,
    ``prefix_cache_hits_total``, ``prefix_cache_hit_rate``, ``ttft_mean_s``,
    ``itl_mean_s``, ``e2e_mean_s`` (those the server exposes; rates and means need
    two scrapes and requests in between), ``policy_version`` (embedded engine).
    """

    def __init__(self, server: int, fetch: Callable[[], Awaitable[Mapping[str, float]]], url: str | None = None):
        self.server = server
        self.fetch = fetch
        self.url = url
        self._previous: tuple[float, Mapping[str, float]] | None = None

    async def __call__(self) -> list[Event]:
        started = time.time()
        metrics = await self.fetch()
        return [self.event(metrics, started, time.time() - started)]

    def event(self, metrics: Mapping[str, float], now: float, duration_s: float = 0.0) -> Event:
        """The event of a scrape taken at ``now`` (updates the reference for the next rates)."""
        event: Event = {
            "kind": "infra.inference",
            "start": now,
            "duration_s": duration_s,
            "component": "inference",
            "server": self.server,
        }
        if self.url:
            event["url"] = self.url
        for field, names in GAUGES.items():
            value = next((metrics[n] for n in names if n in metrics), None)
            if value is not None:
                event[field] = float(value)
        if "telescope:policy_version" in metrics:
            event["policy_version"] = int(metrics["telescope:policy_version"])
        previous = self._previous
        elapsed = now - previous[0] if previous is not None else 0.0

        def delta(name: str) -> float | None:
            if previous is None or name not in metrics or name not in previous[1]:
                return None
            change = metrics[name] - previous[1][name]
            return change if change >= 0 else None  # a restarted server resets its counters

        for field, name in RATES.items():
            if name in metrics:
                event[f"{field}_total"] = float(metrics[name])
                change = delta(name)
                if change is not None and elapsed > 0:
                    event[f"{field}_per_s"] = change / elapsed
        queries, hits = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
        if queries in metrics:
            event["prefix_cache_queries_total"] = float(metrics[queries])
            event["prefix_cache_hits_total"] = float(metrics.get(hits, 0.0))
            asked, found = delta(queries), delta(hits)
            if asked and found is not None:
                event["prefix_cache_hit_rate"] = found / asked
        for field, name in MEANS.items():
            count, total = delta(f"{name}_count"), delta(f"{name}_sum")
            if count and total is not None:
                event[f"{field}_mean_s"] = total / count
        self._previous = (now, dict(metrics))
        return event
