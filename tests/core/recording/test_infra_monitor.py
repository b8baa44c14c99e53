"""The infra monitor: containment, flush, the /metrics scraper, the run's collectors and their intervals.

The scrape of a real embedded server is in tests/core/inference/test_inference_metrics.py (its fixtures live there).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from telescope.api import events
from telescope.config.composition import config_from_dict
from telescope.recording.infra_monitor import Collector, InferenceMetricsScraper, InfraMonitor, publish
from telescope.recording.run_reader import RunReader
from telescope.recording.run_store import RunStore
from telescope.runtime.monitoring import build_infra_monitor, system_events, torch_memory_events


async def wait_until(condition: Any, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def test_a_failing_collector_is_logged_and_the_others_go_on(caplog: pytest.LogCaptureFixture) -> None:
    published: list[Mapping[str, Any]] = []
    ticks = {"good": 0}

    async def good() -> list[dict[str, Any]]:
        ticks["good"] += 1
        return [{"kind": "infra.test", "start": 1.0, "duration_s": 0.0, "tick": ticks["good"]}]

    async def broken() -> list[dict[str, Any]]:
        raise ConnectionError("server gone")

    async def hung() -> list[dict[str, Any]]:
        await asyncio.sleep(3600)
        return []

    monitor = InfraMonitor(
        [Collector("good", 0.01, good), Collector("broken", 0.01, broken), Collector("hung", 0.01, hung, 0.02)],
        published.append,
    )

    async def go() -> None:
        monitor.start()
        failures = monitor.failures
        await wait_until(lambda: failures["broken"] >= 3 and failures["hung"] >= 2 and len(published) >= 5)
        await monitor.stop(flush=False)

    with caplog.at_level(logging.DEBUG, logger="telescope.recording.infra_monitor"):
        asyncio.run(go())
    assert [e["tick"] for e in published] == list(range(1, len(published) + 1))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # one per failing collector, not one per failure
    assert any("broken" in w and "server gone" in w for w in warnings)
    assert any("hung" in w and "timed out" in w for w in warnings)


def test_a_collector_that_recovers_is_announced_and_stop_flushes(caplog: pytest.LogCaptureFixture) -> None:
    state = {"calls": 0}
    published: list[Mapping[str, Any]] = []

    async def flaky() -> list[dict[str, Any]]:
        state["calls"] += 1
        if state["calls"] == 1:
            raise RuntimeError("not yet")
        return [{"kind": "infra.test", "start": 0.0, "call": state["calls"]}]

    monitor = InfraMonitor([Collector("flaky", 3600.0, flaky)], published.append)

    async def go() -> None:
        collector = monitor.collectors[0]
        assert await monitor.collect_once(collector) == 0
        assert await monitor.collect_once(collector) == 1
        monitor.start()  # the first tick is an hour away
        await monitor.stop()  # ... so only the flush collects

    with caplog.at_level(logging.INFO, logger="telescope.recording.infra_monitor"):
        asyncio.run(go())
    assert [e["call"] for e in published] == [2, 3]
    assert any("flaky works again" in r.getMessage() for r in caplog.records)


@pytest.mark.exclusive  # asserts stop returns within seconds of its flush timeout: on free cores
def test_stop_returns_when_a_collector_missed_its_cancellation() -> None:
    """A collection that completes as it is cancelled can swallow the cancellation (Python 3.11's wait_for
    returns its result): a run then hung at its end, the monitor still collecting while ``stop`` waited."""
    collections = {"count": 0}

    async def nothing() -> list[dict[str, Any]]:
        return []

    monitor = InfraMonitor([Collector("lossy", 0.01, nothing)], lambda event: None)

    async def lossy_collect_once(collector: Collector, **kwargs: Any) -> int:
        collections["count"] += 1
        with contextlib.suppress(asyncio.CancelledError):  # the lost cancellation
            await asyncio.sleep(0.05)
        return 0

    monitor.collect_once = lossy_collect_once  # type: ignore[method-assign]

    async def go() -> float:
        monitor.start()
        await asyncio.sleep(0.2)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await monitor.stop(flush_timeout_s=2.0)
        return loop.time() - start

    assert asyncio.run(asyncio.wait_for(go(), timeout=20)) < 5.0
    assert collections["count"] > 1


def test_published_events_reach_the_run_store(tmp_path: Path) -> None:
    with RunStore(tmp_path) as store:
        store.capture_events()
        publish({"kind": "infra.system", "start": 12.5, "duration_s": 0.0, "node": "10.0.0.1", "cpu_count": 8})
    [event] = [e for e in RunReader(tmp_path).events() if e["kind"] == "infra.system"]
    assert event["start"] == 12.5 and event["node"] == "10.0.0.1" and event["cpu_count"] == 8


def test_scraper_computes_rates_and_interval_means() -> None:
    scraper = InferenceMetricsScraper(3, lambda: None, "http://h:1")  # type: ignore[arg-type,return-value]
    first = scraper.event(
        {
            "vllm:num_requests_running": 4.0,
            "vllm:num_requests_waiting": 2.0,
            "vllm:kv_cache_usage_perc": 0.25,
            "vllm:generation_tokens_total": 1000.0,
            "vllm:prompt_tokens_total": 500.0,
            "vllm:prefix_cache_queries_total": 500.0,
            "vllm:prefix_cache_hits_total": 100.0,
            "vllm:time_to_first_token_seconds_sum": 2.0,
            "vllm:time_to_first_token_seconds_count": 10.0,
            "vllm:inter_token_latency_seconds_sum": 5.0,
            "vllm:inter_token_latency_seconds_count": 100.0,
        },
        100.0,
    )
    assert first["kind"] == "infra.inference" and first["server"] == 3 and first["url"] == "http://h:1"
    assert (first["requests_running"], first["requests_waiting"], first["kv_cache_usage"]) == (4.0, 2.0, 0.25)
    assert first["generation_tokens_total"] == 1000.0
    assert "generation_tokens_per_s" not in first and "ttft_mean_s" not in first  # one scrape: no interval yet
    second = scraper.event(
        {
            "vllm:num_requests_running": 1.0,
            "vllm:num_requests_waiting": 0.0,
            "vllm:gpu_cache_usage_perc": 0.5,
            "vllm:generation_tokens_total": 1400.0,
            "vllm:prompt_tokens_total": 700.0,
            "vllm:prefix_cache_queries_total": 700.0,
            "vllm:prefix_cache_hits_total": 150.0,
            "vllm:time_to_first_token_seconds_sum": 3.0,
            "vllm:time_to_first_token_seconds_count": 14.0,
            "vllm:inter_token_latency_seconds_sum": 5.0,
            "vllm:inter_token_latency_seconds_count": 100.0,
        },
        102.0,
    )
    assert second["generation_tokens_per_s"] == pytest.approx(200.0)
    assert second["prompt_tokens_per_s"] == pytest.approx(100.0)
    assert second["prefix_cache_hit_rate"] == pytest.approx(0.25)
    assert second["ttft_mean_s"] == pytest.approx(0.25)
    assert "itl_mean_s" not in second  # no token in the interval
    assert second["kv_cache_usage"] == 0.5  # the older vLLM name
    restarted = scraper.event({"vllm:generation_tokens_total": 10.0}, 104.0)
    assert "generation_tokens_per_s" not in restarted  # a counter that went down gives no rate


class FakeMethod:
    def __init__(self, result: Any) -> None:
        self.result = result

    def remote(self) -> Any:
        async def value() -> Any:
            if isinstance(self.result, Exception):
                raise self.result
            return self.result

        return value()


class FakeActor:
    def __init__(self, **methods: Any) -> None:
        for name, result in methods.items():
            setattr(self, name, FakeMethod(result))


class FakeLocalSampler:
    """A sampler of the driver's own node: a plain method, no Ray call."""

    def drain(self) -> dict[str, Any]:
        return {"node": "10.0.0.1", "hostname": "n1", "samples": [{"time": 4.0, "cpu_count": 8}]}


class FakeClient:
    def __init__(self, url: str) -> None:
        self.base_url = url

    async def metrics(self) -> dict[str, float]:
        return {"vllm:num_requests_running": 1.0}


def test_the_run_collectors_use_the_configured_intervals() -> None:
    config = config_from_dict(
        {
            "environments": [{"name": "countdown"}],
            "system_metrics_collection_interval_seconds": 2.5,
            "ray_torch_memory_drain_interval_seconds": 0.75,
            "metrics_logger_interval_seconds": 4.0,
        }
    )
    node = FakeActor(drain={"node": "10.0.0.2", "hostname": "n2", "samples": [{"time": 5.0, "cpu_count": 16}]})
    samples = [{"time": 6.0, "device": "cpu", "process_rss_gb": 1.5}]
    trainer = FakeActor(drain_torch_memory={"rank": 1, "node": "10.0.0.3", "pid": 42, "samples": samples})
    dead = FakeActor(drain_torch_memory=RuntimeError("actor died"))
    local = FakeLocalSampler()
    monitor = build_infra_monitor(
        config,
        node_samplers=[local, node],
        trainers=[dead, trainer],
        clients=[FakeClient("http://a"), FakeClient("http://b")],
    )
    intervals = {c.name: c.interval_s for c in monitor.collectors}
    assert intervals == {"system": 2.5, "torch_memory": 0.75, "inference_0": 4.0, "inference_1": 4.0}
    collected = {c.name: asyncio.run(c.collect()) for c in monitor.collectors}  # type: ignore[arg-type]
    [driver_node, system] = collected["system"]  # the driver's node (sampled in-process), then an actor's
    assert driver_node == {
        "kind": "infra.system",
        "start": 4.0,
        "duration_s": 0.0,
        "component": "system",
        "node": "10.0.0.1",
        "hostname": "n1",
        "cpu_count": 8,
    }
    assert system == {
        "kind": "infra.system",
        "start": 5.0,
        "duration_s": 0.0,
        "component": "system",
        "node": "10.0.0.2",
        "hostname": "n2",
        "cpu_count": 16,
    }
    [memory] = collected["torch_memory"]  # the dead rank does not hide the live one's samples
    assert memory["kind"] == "infra.torch_memory" and memory["rank"] == 1 and memory["node"] == "10.0.0.3"
    assert memory["start"] == 6.0 and memory["process_rss_gb"] == 1.5
    assert [e[0]["server"] for n, e in collected.items() if n.startswith("inference")] == [0, 1]
    short = config_from_dict(
        {"environments": [{"name": "countdown"}], "system_metrics_collection_interval_seconds": 0.1}
    )
    assert build_infra_monitor(short, node_samplers=[node]).collectors[0].interval_s == 1.0  # drained at most 1/s
    assert build_infra_monitor(config).collectors == []


def test_drained_samples_become_events_without_changing_them() -> None:
    drained = {"node": "n", "hostname": "h", "samples": [{"time": 1.0, "x": 1}]}
    assert system_events(drained)[0]["start"] == 1.0 and system_events(drained)[0]["x"] == 1
    trained = {"rank": 0, "node": "n", "pid": 1, "samples": [{"time": 2.0, "torch_allocated_gb": 3.0}]}
    assert torch_memory_events(trained)[0] == torch_memory_events(trained)[0]
    assert "time" not in torch_memory_events(trained)[0]


def test_events_bus_gets_the_monitor_events() -> None:
    got: list[dict[str, Any]] = []
    unsubscribe = events.subscribe(got.append)
    try:

        async def one() -> list[dict[str, Any]]:
            return [{"kind": "infra.inference", "start": 3.0, "duration_s": 0.1, "server": 0, "requests_running": 2.0}]

        asyncio.run(InfraMonitor([Collector("x", 1.0, one)]).collect_once(Collector("x", 1.0, one)))
    finally:
        unsubscribe()
    assert got == [{"kind": "infra.inference", "start": 3.0, "duration_s": 0.1, "server": 0, "requests_running": 2.0}]
