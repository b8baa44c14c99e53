"""The run's monitoring actors on a real (local, 2-CPU) Ray cluster: node samplers, trainer memory, the receiver.

Also the trainer actor's rendezvous port, reserved until its set-up (it shares this module's cluster).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import ray

from telescope.api.context import InferenceContext, TrainerContext
from telescope.config.composition import config_from_dict
from telescope.inference.plugin import VLLMSettings
from telescope.runtime.monitoring import (
    NodeSampler,
    start_node_samplers,
    stop_node_samplers,
    system_events,
    torch_memory_events,
)
from telescope.runtime.ray_services import RayServices

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", namespace="telescope-monitoring-test")
    yield
    ray.shutdown()


def drain_until(drain: Callable[[], dict[str, Any]], count: int, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    result = drain()
    samples = list(result["samples"])
    while len(samples) < count:
        assert time.monotonic() < deadline, f"only {len(samples)} samples in time"
        time.sleep(0.05)
        result = drain()
        samples += result["samples"]
    return {**result, "samples": samples}


def assert_node_samples(drained: dict[str, Any]) -> None:
    events = system_events(drained)
    assert {e["node"] for e in events} == {ray.util.get_node_ip_address()}
    assert all(e["kind"] == "infra.system" and e["hostname"] == socket.gethostname() for e in events)
    assert {"cpu_utilization_percent", "system_memory_used_gb", "disk_total_gb"} <= set(events[-1])
    assert "network_sent_mb_s" in events[-1]  # the second sample has rates


def test_the_drivers_node_is_sampled_by_a_thread_of_the_driver(tmp_path: Path) -> None:
    samplers = start_node_samplers(0.05, str(tmp_path))
    try:
        assert len(samplers) == len([n for n in ray.nodes() if n["Alive"]]) == 1
        [sampler] = samplers
        assert isinstance(sampler, NodeSampler)  # no actor, so no worker process of its own
        assert_node_samples(drain_until(sampler.drain, 2))
    finally:
        assert stop_node_samplers(samplers) == []  # nothing left to kill
    assert sampler.sampler._thread is None  # its thread was stopped


def test_a_node_other_than_the_drivers_gets_an_actor(tmp_path: Path) -> None:
    samplers = start_node_samplers(0.05, str(tmp_path), driver_node_id="a node that is not this one")
    try:
        [actor] = samplers
        assert not isinstance(actor, NodeSampler)
        assert_node_samples(drain_until(lambda: ray.get(actor.drain.remote()), 2))
        assert stop_node_samplers(samplers) == [actor]  # the workers' shutdown kills it
    finally:
        for sampler in samplers:
            ray.kill(sampler)


def test_through_ray_client_the_driver_is_on_no_node_and_every_node_gets_an_actor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray.util.client

    monkeypatch.setattr(ray.util.client.ray, "is_connected", lambda: True)  # as after ray.init("ray://...")
    samplers = start_node_samplers(0.05, str(tmp_path))
    try:
        assert len(samplers) == 1 and not isinstance(samplers[0], NodeSampler)
    finally:
        for sampler in samplers:
            ray.kill(sampler)


def test_a_trainer_rank_samples_its_torch_memory_and_drains_it() -> None:
    from telescope.runtime.workers import TrainerWorker

    actor: Any = TrainerWorker
    worker = actor.options(num_cpus=0).remote(
        "fsdp", TrainerContext(model="not-loaded"), None, None, None, 3, 4, 1.0, torch_memory_interval_s=0.05
    )
    try:
        drained = drain_until(lambda: ray.get(worker.drain_torch_memory.remote()), 2)
        events = torch_memory_events(drained)
        assert {(e["rank"], e["node"]) for e in events} == {(3, ray.util.get_node_ip_address())}
        assert all(e["device"] == "cpu" and e["process_rss_gb"] > 0 for e in events)  # no GPU here: the RSS
        assert [e["start"] for e in events] == sorted(e["start"] for e in events)
    finally:
        ray.kill(worker)


def test_rank_zero_holds_the_groups_port_until_its_setup_ends() -> None:
    from telescope.runtime.workers import TrainerWorker

    actor: Any = TrainerWorker
    worker = actor.options(num_cpus=0).remote("fsdp", TrainerContext(model="not-loaded"), None, None, None, 0, 1, 1.0)
    try:
        _, port = ray.get(worker.rendezvous_address.remote())
        assert ray.get(worker.rendezvous_address.remote())[1] == port  # asked again: the same reservation
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # held: no other process can take it before the store listens
        process = psutil.Process(ray.get(worker.placement.remote())["pid"])
        with pytest.raises(ray.exceptions.RayTaskError):
            ray.get(worker.setup.remote("127.0.0.1", port))  # the model cannot load, after the group formed
        listening = {c.laddr.port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        assert port in listening  # rank 0's store took the reserved port over
        assert ray.get(worker.rendezvous_address.remote())[1] != port  # the failed set-up ended the reservation
    finally:
        ray.kill(worker)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_run_starts_the_receiver_for_vllm_and_stops_it(tmp_path: Path) -> None:
    config = config_from_dict({"environments": [{"name": "countdown"}]})
    port = free_port()
    services = RayServices(config, tmp_path)
    context = services._start_trace_receiver("vllm", VLLMSettings(otlp_receiver_port=port), InferenceContext(model="m"))
    services._start_node_samplers()  # started after the workers' actors in a run
    try:
        assert context.traces_endpoint == f"http://127.0.0.1:{port}/v1/traces"  # one node: loopback
        assert httpx.post(context.traces_endpoint, content=b"", timeout=10).status_code == 200  # an empty export
        assert len(services.node_samplers) == 1
    finally:
        services.shutdown()
    assert services.trace_receiver is None and services.node_samplers == []
    with pytest.raises(httpx.ConnectError):
        httpx.post(context.traces_endpoint, content=b"", timeout=10)
    for backend, settings in (("vllm", VLLMSettings(enable_vllm_tracing=False)), ("embedded", None)):
        other = RayServices(config, tmp_path)
        try:
            assert other._start_trace_receiver(backend, settings, InferenceContext(model="m")).traces_endpoint is None
            assert other.trace_receiver is None
        finally:
            other.shutdown()
