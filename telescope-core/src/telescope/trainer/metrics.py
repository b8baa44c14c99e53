"""Step metrics: section timers and the cross-rank reduction.

Timers accumulate wall time per section (``forward``, ``backward``,
``loss_computation``, ``compute_entropy``, ``compute_kl``, ``data_to_device``,
``prepare_tensors``, ``optimizer``) and produce ``timing_<section>_total`` and
``timing_<section>_microbatch_mean``: the metric names of the reference (seed
000), one flat convention for the whole step's timing line, the orchestrator's
``timing_step_total`` and ``timing_waiting_for_data`` included. Metrics a custom
backend adds keep the section/group/metric form (``custom/my_group/value``). On
CUDA without timeline records a section synchronises the device before reading the
clock, so that asynchronous kernels are charged to the section that launched them.

Timeline records: with ``record_events`` (the ``track_gpu_events`` setting) each
section also becomes one record ``{"kind": "trainer.<section>", "start",
"duration_s", "clock", ...}`` with the ids given to :meth:`SectionTimers.section`
(``microbatch``, ``minibatch``). On CUDA the sections are then timed with CUDA events
(no synchronisation per section; one at :meth:`SectionTimers.finish`), each placed on
the wall clock by an anchor event recorded after a synchronisation; on the CPU with
the wall clock.

The loss parts of the shared loss controls (``LOSS_PART_KEYS``) are summed like the loss.

Every metric is reduced over data-parallel ranks: quantities that are global sums
(loss terms, entropy and KL sums, token counts) are summed, then divided by global
counts; timings are averaged over ranks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from telescope.api.algorithm import LossMetrics

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
    """Totals per named section, and optionally one timeline record per section (see the module docstring)."""

    def __init__(self, device: torch.device, *, record_events: bool = False) -> None:
        self.device = device
        self.totals: dict[str, float] = dict.fromkeys(TIMED_SECTIONS, 0.0)
        self.record_events = record_events
        #: finished timeline records (complete after :meth:`finish`)
        self.records: list[dict[str, Any]] = []
        self._cuda_events = record_events and device.type == "cuda"
        self._pending: list[tuple[str, dict[str, Any], Any, Any]] = []
        if self._cuda_events:
            torch.cuda.synchronize(device)
            self._anchor_wall = time.time()
            self._anchor = torch.cuda.Event(enable_timing=True)
            self._anchor.record()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def section(self, name: str, **ids: Any) -> Iterator[None]:
        """Time the block as section ``name``; ``ids`` (microbatch, minibatch, ...) go into its record."""
        if self._cuda_events:
            begin = torch.cuda.Event(enable_timing=True)
            begin.record()
            try:
                yield
            finally:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                self._pending.append((name, ids, begin, end))
            return
        self._sync()
        wall = time.time()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            elapsed = time.perf_counter() - start
            self.totals[name] = self.totals.get(name, 0.0) + elapsed
            if self.record_events:
                self.records.append(
                    {"kind": f"trainer.{name}", "start": wall, "duration_s": elapsed, "clock": "wall", **ids}
                )

    def finish(self) -> None:
        """Resolve pending CUDA events (one synchronisation) into totals and records; idempotent."""
        if not self._pending:
            return
        self._sync()
        for name, ids, begin, end in self._pending:
            elapsed = begin.elapsed_time(end) / 1000.0
            self.totals[name] = self.totals.get(name, 0.0) + elapsed
            start = self._anchor_wall + self._anchor.elapsed_time(begin) / 1000.0
            self.records.append(
                {"kind": f"trainer.{name}", "start": start, "duration_s": elapsed, "clock": "cuda_event", **ids}
            )
        self._pending.clear()

    def metrics(self, num_microbatches: int) -> dict[str, float]:
        self.finish()
        out: dict[str, float] = {}
        for name, total in self.totals.items():
            out[f"timing_{name}_total"] = total
            out[f"timing_{name}_microbatch_mean"] = total / max(num_microbatches, 1)
        return out


#: Sums of the shared loss controls (:class:`~telescope.api.algorithm.LossMetrics`), always all-reduced
#: (zeros when off) and reported when enabled: ``loss/kl_penalty`` and ``loss/entropy_bonus`` are the
#: parts of ``loss`` (``loss = policy + kl_penalty - entropy_bonus``, same averaging over minibatches),
#: ``seq_is/masked_sequences`` the samples ``seq_is_masking`` dropped in the step.
LOSS_PART_KEYS = ("loss/kl_penalty", "loss/entropy_bonus", "seq_is/masked_sequences")


def loss_parts(parts: LossMetrics, denominator: float) -> dict[str, float]:
    """One micro-batch's :class:`LossMetrics` as floats; the loss parts divided by the loss denominator."""
    kl, bonus, dropped = parts.kl_penalty, parts.entropy_bonus, parts.masked_sequences
    return {
        "loss/kl_penalty": float(kl) / denominator if kl is not None else 0.0,
        "loss/entropy_bonus": float(bonus) / denominator if bonus is not None else 0.0,
        "seq_is/masked_sequences": float(dropped) if dropped is not None else 0.0,
    }
