"""Step metrics: section timers and the cross-rank reduction.

Timers accumulate wall time per section (``forward``, ``backward``,
``loss_computation``, ``compute_entropy``, ``compute_kl``, ``data_to_device``,
``prepare_tensors``, ``optimizer``) and produce ``timing_<section>_total`` and
``timing_<section>_microbatch_mean``: the metric names of the reference (seed
000), one flat convention for the whole step's timing line, the orchestrator's
``timing_step_total`` and ``timing_waiting_for_data`` included. Metrics a custom
backend adds keep the section/group/metric form (``custom/my_group/value``). On
CUDA a section synchronises the device before reading the clock, so that
asynchronous kernels are charged to the section that launched them.

Every metric is reduced over data-parallel ranks: quantities that are global sums
(loss terms, entropy and KL sums, token counts) are summed, then divided by global
counts; timings are averaged over ranks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

TIMED_SECTIONS = (
    "forward",
    "backward",
    "loss_computation",
    "compute_entropy",
    "compute_kl",
    "data_to_device",
    "prepare_tensors",
    "optimizer",
)

#: Keys every trainer backend returns from ``train_step`` (the conformance kit checks them).
REQUIRED_METRICS = (
    "entropy",
    "kl_divergence_inference",
    "grad_norm",
    "learning_rate",
    "loss",
    *(f"timing_{s}_total" for s in TIMED_SECTIONS),
    *(f"timing_{s}_microbatch_mean" for s in TIMED_SECTIONS),
)


class SectionTimers:
    """Wall-clock totals per named section."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.totals: dict[str, float] = dict.fromkeys(TIMED_SECTIONS, 0.0)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - start

    def metrics(self, num_microbatches: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, total in self.totals.items():
            out[f"timing_{name}_total"] = total
            out[f"timing_{name}_microbatch_mean"] = total / max(num_microbatches, 1)
        return out
