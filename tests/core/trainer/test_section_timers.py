"""Section timers' timeline records: the wall clock on the CPU, CUDA events placed on the wall clock on a GPU.

The CUDA path is checked here with stand-in events (this machine may have no GPU): the
records must come from the events' elapsed times, anchored to the wall clock, with
one synchronisation when they are resolved instead of one per section.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from telescope.trainer.metrics import SectionTimers


class FakeCudaEvent:
    """Records the time of a fake GPU clock (``FakeCudaEvent.now``, s); ``elapsed_time`` in ms, as CUDA's.

    The test moves the clock itself, so the durations it asserts are exact on any machine.
    """

    now = 0.0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at: float | None = None

    def record(self) -> None:
        self.at = FakeCudaEvent.now

    def elapsed_time(self, end: FakeCudaEvent) -> float:
        assert self.at is not None and end.at is not None
        return (end.at - self.at) * 1000.0


def test_cpu_sections_are_wall_clock_records() -> None:
    timers = SectionTimers(torch.device("cpu"), record_events=True)
    before = time.time()
    with timers.section("forward", microbatch=0, minibatch=0):
        time.sleep(0.02)
    [record] = timers.records
    assert record["kind"] == "trainer.forward" and record["clock"] == "wall"
    assert (record["microbatch"], record["minibatch"]) == (0, 0)
    assert before <= record["start"] and record["duration_s"] >= 0.02
    assert timers.metrics(1)["timing_forward_total"] == record["duration_s"]
    assert SectionTimers(torch.device("cpu")).records == []  # off: totals only


def test_cuda_sections_are_event_timed_and_anchored(monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[Any] = []
    monkeypatch.setattr(torch.cuda, "Event", FakeCudaEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    monkeypatch.setattr(FakeCudaEvent, "now", 100.0)
    device = torch.device("cuda", 0)
    wall = time.time()
    timers = SectionTimers(device, record_events=True)
    assert len(syncs) == 1  # the anchor
    FakeCudaEvent.now += 0.5  # GPU work queued before the first section
    with timers.section("forward", microbatch=0):
        FakeCudaEvent.now += 0.02
    with timers.section("backward", microbatch=0):
        FakeCudaEvent.now += 0.03
    assert len(syncs) == 1 and timers.records == []  # no synchronisation per section; resolved later
    metrics = timers.metrics(1)
    assert len(syncs) == 2
    forward, backward = timers.records
    assert forward["clock"] == backward["clock"] == "cuda_event"
    assert forward["duration_s"] == pytest.approx(0.02) and backward["duration_s"] == pytest.approx(0.03)
    # anchored: the wall time at the anchor plus the GPU time since it
    assert wall <= forward["start"] - 0.5 <= time.time()
    assert backward["start"] == pytest.approx(forward["start"] + 0.02)
    assert metrics["timing_forward_total"] == forward["duration_s"]
    assert metrics["timing_backward_total"] == backward["duration_s"]
    timers.finish()  # idempotent
    assert len(timers.records) == 2 and len(syncs) == 2
