"""Per-request latency histograms of the embedded engine, exposed like vLLM's on ``/metrics``.

The engine observes, from its loop thread, the time to first token of each request
(arrival to its first sampled token; the ``n`` samples of a request share one
prefill, so one observation per request) and the inter-token latency of every later
token of every sequence (time since that sequence's previous token). The server's
collector reads them at scrape time as ``vllm:time_to_first_token_seconds`` and
``vllm:inter_token_latency_seconds`` (Prometheus histograms: cumulative buckets,
``_sum``, ``_count``), so one scraper reads both backends.

A plain bucket array under a lock rather than ``prometheus_client.Histogram``:
the engine stays free of a metrics registry and the server labels the families
with the served model name, as vLLM does. Buckets span vLLM's ranges (milliseconds
to minutes), which also fit a CPU engine.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)


class LatencyHistogram:
    """Observations counted into ``le`` buckets (upper bounds, inclusive), with their sum."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(sorted(bounds))
        self._counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.bounds, value)
        with self._lock:
            self._counts[index] += 1
            self._sum += value

    def snapshot(self) -> tuple[list[tuple[str, float]], float, int]:
        """(cumulative ``(le, count)`` buckets ending with ``+Inf``, sum, count)."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip([*map(str, self.bounds), "+Inf"], counts, strict=True):
            running += count
            buckets.append((bound, float(running)))
        return buckets, total, running


class RequestLatencies:
    """The engine's two histograms."""

    def __init__(self) -> None:
        self.time_to_first_token = LatencyHistogram(TTFT_BUCKETS)
        self.inter_token = LatencyHistogram(ITL_BUCKETS)
