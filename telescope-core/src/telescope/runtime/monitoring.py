"""The run's infrastructure monitoring on Ray: node samplers, trainer memory, server metrics, traces.

:class:`~telescope.runtime.ray_services.RayServices` starts, with the workers:

- one :class:`NodeSampler` per alive node of the cluster, sampling the node with
  :class:`~telescope.recording.system_metrics.SystemSampler` every
  ``system_metrics_collection_interval_seconds`` into a buffer: on the driver's own
  node a thread of the driver, on every other node an actor (``num_cpus=0``, pinned
  with ``NodeAffinitySchedulingStrategy``). The driver's node has no actor because an
  actor is a process of its own: Ray started a new worker process for it, which
  imported Ray and this module (1.2 s of CPU, and about 150 MB) while the trainer and
  the server were starting on the same cores, to take a sample that costs 0.7 ms;
- in each trainer rank (:class:`~telescope.runtime.workers.TrainerWorker`), a
  thread sampling torch memory every ``torch_memory_sample_interval_seconds``;
- with the ``vllm`` backend and ``enable_vllm_tracing``, the OTLP trace receiver
  (:func:`start_trace_receiver`).

Once the workers are up, :func:`record_placements` records where each one runs
(``worker.placed``) and how long it took to start (``worker.startup``).

:func:`build_infra_monitor` then gives the orchestrator one
:class:`~telescope.recording.infra_monitor.InfraMonitor` whose collectors drain the
node samplers (every ``max(1 s, system interval)``: ``infra.system`` events with
``node`` and ``hostname``), drain the trainer ranks (every
``ray_torch_memory_drain_interval_seconds``: ``infra.torch_memory`` with ``rank``
and ``node``) and scrape each inference server's ``/metrics`` (every
``metrics_logger_interval_seconds``: ``infra.inference`` with ``server``). Drains
are Ray calls the orchestrator awaits; the trainer's runs in its own concurrency
group, so it answers during a training step. Samples keep the time they were taken,
so a late drain delays events but does not move them.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from telescope.recording.infra_monitor import Collector, Event, InferenceMetricsScraper, InfraMonitor

if TYPE_CHECKING:
    from telescope.inference.client import InferenceClient
    from telescope.recording.otlp_receiver import OtlpTraceReceiver
    from telescope.schema.config import TelescopeConfig

log = logging.getLogger("telescope.run.monitoring")


class NodeSampler:
    """Samples its node every ``interval_s`` in a thread (see the module docstring); :meth:`drain` takes the samples.

    Used as it is in the driver, and as an actor (:data:`NodeSamplerActor`) on the other nodes.
    """

    def __init__(self, interval_s: float, disk_path: str = "/") -> None:
        from telescope.recording.system_metrics import PeriodicSampler, SystemSampler
        from telescope.runtime.worker_lifetime import exit_with_raylet

        exit_with_raylet()  # as an actor; in the driver it does nothing
        self.node = ray.util.get_node_ip_address()
        self.hostname = socket.gethostname()
        self.system = SystemSampler(disk_path)
        self.sampler = PeriodicSampler(self.system.sample, interval_s, name="system-metrics").start()

    def drain(self) -> dict[str, Any]:
        return {"node": self.node, "hostname": self.hostname, "samples": self.sampler.drain()}

    def stop(self) -> None:
        self.sampler.stop()
        self.system.close()


#: :class:`NodeSampler` as a Ray actor, for the nodes other than the driver's.
NodeSamplerActor: Any = ray.remote(num_cpus=0, max_restarts=0)(NodeSampler)


def start_node_samplers(interval_s: float, disk_path: str = "/", driver_node_id: str | None = None) -> list[Any]:
    """One sampler per alive node: a :class:`NodeSampler` for the driver's, an actor for each other node.

    ``driver_node_id`` defaults to the node this process runs on; through Ray Client
    (``ray://``) it runs on none of the cluster's nodes, and every node gets an actor. A
    node where the sampler cannot start is logged and skipped.
    """
    if driver_node_id is None:
        from ray.util.client import ray as ray_client

        driver_node_id = "" if ray_client.is_connected() else ray.get_runtime_context().get_node_id()
    samplers: list[Any] = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        try:
            if node["NodeID"] == driver_node_id:
                samplers.append(NodeSampler(interval_s, disk_path))
                continue
            strategy = NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
            samplers.append(NodeSamplerActor.options(scheduling_strategy=strategy).remote(interval_s, disk_path))
        except Exception as exc:
            log.warning("no system metrics from node %s: %s", node.get("NodeManagerAddress"), exc)
    return samplers


def stop_node_samplers(samplers: Sequence[Any]) -> list[Any]:
    """Stop the driver's own samplers; returns the others, the actors (for the workers' shutdown to kill)."""
    actors = []
    for sampler in samplers:
        if isinstance(sampler, NodeSampler):
            sampler.stop()
        else:
            actors.append(sampler)
    return actors


def system_events(drained: dict[str, Any]) -> list[Event]:
    """``infra.system`` events of one :meth:`NodeSampler.drain` result."""
    where = {"component": "system", "node": drained["node"], "hostname": drained["hostname"]}
    return [
        {"kind": "infra.system", "start": s["time"], "duration_s": 0.0, **where, **_without_time(s)}
        for s in drained["samples"]
    ]


def torch_memory_events(drained: dict[str, Any]) -> list[Event]:
    """``infra.torch_memory`` events of one ``TrainerWorker.drain_torch_memory`` result."""
    where = {"component": "trainer", "rank": drained["rank"], "node": drained["node"], "pid": drained["pid"]}
    return [
        {"kind": "infra.torch_memory", "start": s["time"], "duration_s": 0.0, **where, **_without_time(s)}
        for s in drained["samples"]
    ]


def _without_time(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in sample.items() if k != "time"}


class WorkerGone(ConnectionError):
    """A sampled worker (its Ray actor) died; the infra monitor logs this instead of Ray's error text."""


def _drain_collector(name: str, interval_s: float, actors: Sequence[Any], method: str, to_events: Any) -> Collector:
    async def collect() -> list[Event]:
        out: list[Event] = []
        errors: list[BaseException] = []
        for actor in actors:  # one failing actor must not hide the others' samples
            try:
                call = getattr(actor, method)
                # an actor's method (an awaitable Ray call), or a NodeSampler of this process (answers at once)
                out.extend(to_events(await call.remote() if hasattr(call, "remote") else call()))
            except ray.exceptions.RayActorError:
                # why the worker died is the run's to say (runtime.worker_deaths tells a signal from an
                # out-of-memory kill); Ray's own text guesses at memory, so it is not repeated here
                errors.append(WorkerGone("the worker it reads from died"))
            except Exception as exc:
                errors.append(exc)
        if errors and not out:
            raise errors[0]
        if errors:
            log.debug("%s: %d of %d actors failed: %s", name, len(errors), len(actors), errors[0])
        return out

    return Collector(name, interval_s, collect)


def build_infra_monitor(
    config: TelescopeConfig,
    *,
    node_samplers: Sequence[Any] = (),
    trainers: Sequence[Any] = (),
    clients: Sequence[InferenceClient] = (),
) -> InfraMonitor:
    """The run's monitor over these actors and clients, with the intervals of ``config``."""
    collectors: list[Collector] = []
    if node_samplers:
        interval = max(1.0, config.system_metrics_collection_interval_seconds)
        collectors.append(_drain_collector("system", interval, node_samplers, "drain", system_events))
    if trainers:
        collectors.append(
            _drain_collector(
                "torch_memory",
                config.ray_torch_memory_drain_interval_seconds,
                trainers,
                "drain_torch_memory",
                torch_memory_events,
            )
        )
    for index, client in enumerate(clients):
        scraper = InferenceMetricsScraper(index, client.metrics, client.base_url)
        collectors.append(Collector(f"inference_{index}", config.metrics_logger_interval_seconds, scraper))
    return InfraMonitor(collectors)


def start_trace_receiver(
    port: int, multi_node: bool, access_token: str | None = None
) -> tuple[OtlpTraceReceiver | None, str | None]:
    """The OTLP receiver on ``port`` (else on a free port, with a warning); returns it and its endpoint.

    Loopback on a single node; with several nodes it listens on the IP Ray reports for
    this node (never every interface). ``access_token``: the run token it asks for.
    ``(None, None)`` (and a warning) when it cannot start: vLLM then starts without tracing.
    """
    from telescope.recording.otlp_receiver import OtlpTraceReceiver

    host = ray.util.get_node_ip_address() if multi_node else "127.0.0.1"
    try:
        receiver = OtlpTraceReceiver(host, port, access_token=access_token).start()
    except OSError as exc:
        log.warning("otlp_receiver_port %d is not free (%s); the trace receiver takes another port", port, exc)
        try:
            receiver = OtlpTraceReceiver(host, 0, access_token=access_token).start()
        except (OSError, RuntimeError) as again:
            log.warning("the OTLP trace receiver could not start (%s); vLLM runs without tracing", again)
            return None, None
    except RuntimeError as exc:
        log.warning("the OTLP trace receiver could not start (%s); vLLM runs without tracing", exc)
        return None, None
    return receiver, receiver.endpoint()


def record_placements(servers: Sequence[dict[str, Any]], trainers: Sequence[dict[str, Any]]) -> None:
    """Per server and trainer rank (their ``placement()``): ``worker.placed`` and ``worker.startup`` events.

    ``worker.startup`` spans the worker's process start to its readiness (a server's
    first answer, a rank's set-up end: its imports, the model's load and the prewarm);
    a placement without both times gets none.
    """
    from telescope.api.events import emit

    def startup(placed: dict[str, Any], **fields: Any) -> None:
        if placed.get("started_at") is not None and placed.get("ready_at") is not None:
            duration = max(0.0, placed["ready_at"] - placed["started_at"])
            emit("worker.startup", start=placed["started_at"], duration_s=duration, node=placed["node"], **fields)

    for index, placed in enumerate(servers):
        emit(
            "worker.placed",
            component="inference",
            server=index,
            node=placed["node"],
            url=placed["url"],
            gpu_ids=placed["gpu_ids"],
        )
        startup(placed, component="inference", server=index)
    for rank, placed in enumerate(trainers):
        emit("worker.placed", component="trainer", rank=rank, node=placed["node"], gpu_ids=placed["gpu_ids"])
        startup(placed, component="trainer", rank=rank)
