"""The run's workers on Ray: placement, actors, the inference clients, weight sync.

Ray is the only distributed engine. :func:`connect_ray` attaches to ``ray_address``
or, when none answers and ``ray_auto_start_local`` is set, starts a local cluster
(the laptop and CI case); the ``ray_*`` options map onto ``ray.init`` and the
runtime environment. :class:`RayServices` then

- reserves a placement group per pool (``ray_*_placement_strategy``,
  ``ray_*_cpus_per_worker``, a GPU per worker when the cluster has GPUs, within
  ``ray_placement_timeout_s``), and places one actor per bundle;
- starts ``inference_num_workers / inference_tensor_parallel_size`` inference
  servers and ``trainer_num_workers`` trainer ranks (process group rendezvous at
  rank 0's address);
- starts the infrastructure monitoring (:mod:`telescope.runtime.monitoring`):
  a system sampler per node, torch memory sampling in each trainer rank, and with
  vLLM and ``enable_vllm_tracing`` the OTLP trace receiver whose address the
  servers get; :meth:`RayServices.infra_monitor` builds the orchestrator's
  collector of all of it;
- connects the weight transport (rank 0 sends, every server receives); the
  orchestrator then pushes the trainer's weights (after a resume or a warm start)
  before the first request, so servers and trainer start identical;
- is the orchestrator's :class:`~telescope.orchestrator.services.TrainingService`,
  and holds its :class:`~telescope.orchestrator.services.GenerationService`
  (``generation``: a :class:`~telescope.orchestrator.services.ServerPool` over the
  servers' clients).

Timeline events: after each step every rank's records (its phases per micro-batch)
are drained and published as ``trainer.<phase>`` with ``rank`` and ``step``; each
rank's ``weights.send`` is published when the weights are pushed; servers' weight
loads (``weights.load``) and requests (``inference.*``) are emitted by their clients.

Shutdown stops every server, kills every actor and removes the placement groups;

Shutdown stops every server, kills every actor (samplers included), stops the
trace receiver and removes the placement groups;
servers are also killed by process group from the driver (same machine), so a
crashed actor leaves no stray process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from telescope.api.records import SupervisedExample, TrainingBatch
from telescope.config.schema import TelescopeConfig
from telescope.orchestrator.services import ServerPool
from telescope.recording.infra_monitor import InfraMonitor

if TYPE_CHECKING:
    from telescope.api.context import InferenceContext
    from telescope.api.settings import PluginSettings

log = logging.getLogger("telescope.run.workers")


def publish_worker_events(records: list[dict[str, Any]], **ids: Any) -> None:
    """Put records made in a worker process on this process's event bus.

    Each gets the fields of the current event context (the orchestrator's ``step``)
    under its own, and ``ids`` (``rank``, ``step``, ...) over them.
    """
    from telescope.recording.events import current_context, publish

    context = current_context()
    for record in records:
        publish({**context, **record, **ids})


class RayStartError(RuntimeError):
    """Ray could not start or place the workers; the message says what to change."""


def runtime_env(config: TelescopeConfig, run_dir: Path) -> dict[str, Any]:
    env: dict[str, Any] = dict(config.ray_runtime_env or {})
    env_vars: dict[str, str] = dict(env.get("env_vars", {}))
    if config.ray_propagate_active_venv and os.environ.get("VIRTUAL_ENV"):
        env_vars.setdefault("VIRTUAL_ENV", os.environ["VIRTUAL_ENV"])
        env_vars.setdefault("PATH", os.environ.get("PATH", ""))
    if config.ray_propagate_run_dir:
        env_vars.setdefault("TELESCOPE_RUN_DIR", str(run_dir))
    for name in ("RAY_AUTH_MODE", "WANDB_MODE", "HF_HUB_OFFLINE", "TELESCOPE_CACHE", "TOKENIZERS_PARALLELISM"):
        if name in os.environ:
            env_vars.setdefault(name, os.environ[name])
    if env_vars:
        env["env_vars"] = env_vars
    if config.ray_pin_py_executable:
        env.setdefault("py_executable", sys.executable)
    return env


def connect_ray(config: TelescopeConfig, run_dir: Path) -> bool:
    """Attach to or start Ray; returns True when this call started a local cluster."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if config.ray_disable_runtime_env_hook:
        os.environ.pop("RAY_RUNTIME_ENV_HOOK", None)
    common: dict[str, Any] = {
        "namespace": config.ray_namespace,
        "log_to_driver": config.ray_log_to_driver,
        "runtime_env": runtime_env(config, run_dir),
        "configure_logging": True,
        "logging_level": "WARNING",
    }
    if ray.is_initialized():
        return False
    address = None if config.ray_address in ("", "local") else config.ray_address
    if address is not None:
        try:
            ray.init(address=address, **common)
            return False
        except ConnectionError as exc:
            if not config.ray_auto_start_local:
                raise RayStartError(
                    f"no Ray cluster at ray_address={config.ray_address!r} ({exc}); start one "
                    "(`ray start --head`) or set ray_auto_start_local: true"
                ) from None
    ray.init(include_dashboard=False, **common)
    return True


def _reserve(name: str, workers: int, cpus: float, gpus: float, strategy: str, timeout_s: int) -> PlacementGroup:
    bundle: dict[str, float] = {"CPU": cpus}
    if gpus:
        bundle["GPU"] = gpus
    group = placement_group([dict(bundle) for _ in range(workers)], strategy=strategy, name=name)
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        available = ray.available_resources()
        raise RayStartError(
            f"could not place {workers} {name} workers with {bundle} each ({strategy}) within {timeout_s} s; "
            f"the cluster has {available.get('CPU', 0):g} CPUs and {available.get('GPU', 0):g} GPUs free. "
            f"Lower ray_{name}_cpus_per_worker or the number of workers, or add nodes."
        ) from None
    return group


class RayServices:
    """Trainer ranks and inference servers as Ray actors (see the module docstring)."""

    def __init__(self, config: TelescopeConfig, run_dir: Path) -> None:
        self.config = config
        self.run_dir = run_dir
        self.trainers: list[Any] = []
        self.servers: list[Any] = []
        self.generation = ServerPool([], config.vllm_scheduling_policy)
        self.server_pids: list[int] = []
        self.groups: list[PlacementGroup] = []
        self.transport_name = ""
        self.receivers_per_server = 1
        self.node_samplers: list[Any] = []
        self.trace_receiver: Any = None

    # ----------------------------------------------------------------- start

    def start(self) -> None:
        from telescope.api.context import InferenceContext, TrainerContext, TransportContext
        from telescope.inference import default_backend_name
        from telescope.inference.client import InferenceClient
        from telescope.plugins.facade import get_plugins
        from telescope.plugins.registry import PluginKind
        from telescope.runtime.workers import InferenceWorker, TrainerWorker
        from telescope.trainer.checkpoint import TrainerCheckpoints
        from telescope.transports import default_transport_name

        c = self.config
        plugins = get_plugins()
        gpu = ray.cluster_resources().get("GPU", 0) > 0
        backend = default_backend_name(gpu) if c.inference_backend == "auto" else c.inference_backend
        self.transport_name = default_transport_name(gpu) if c.weight_transport == "auto" else c.weight_transport
        self.transport_settings = plugins.settings_for(PluginKind.WEIGHT_TRANSPORT, self.transport_name, c)
        self.transport_context = TransportContext.from_config(c)
        inference_context = InferenceContext.from_config(c)
        inference_settings = plugins.settings_for(PluginKind.INFERENCE_BACKEND, backend, c)
        inference_context = self._start_monitoring(backend, inference_settings, inference_context)
        # weight receivers per server: the backend says (1 for the embedded engine, its TP size for vLLM)
        self.receivers_per_server = plugins.inference_backend(backend)(
            inference_context, inference_settings
        ).receivers_per_server()
        algorithm = plugins.create_algorithm(c)
        trainer_settings = plugins.settings_for(PluginKind.TRAINER_BACKEND, c.train_backend, c)
        trainer_context = TrainerContext.from_config(c)
        checkpoints = TrainerCheckpoints.from_config(c)
        servers = c.inference_num_workers // c.inference_tensor_parallel_size
        tp = c.inference_tensor_parallel_size if gpu else 0
        inference_group = _reserve("inference", servers, c.ray_inference_cpus_per_worker, float(tp),
                                   c.ray_inference_placement_strategy, c.ray_placement_timeout_s)  # fmt: skip
        self.groups.append(inference_group)
        trainer_group = _reserve("trainer", c.trainer_num_workers, c.ray_trainer_cpus_per_worker, 1.0 if gpu else 0.0,
                                 c.ray_trainer_placement_strategy, c.ray_placement_timeout_s)  # fmt: skip
        self.groups.append(trainer_group)

        def placed(group: PlacementGroup, index: int, cpus: float, gpus: float) -> dict[str, Any]:
            return {
                "num_cpus": cpus,
                "num_gpus": gpus,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index),
            }

        inference_actor: Any = InferenceWorker  # a Ray actor class (its .options is added by @ray.remote)
        trainer_actor: Any = TrainerWorker
        self.servers = [
            inference_actor.options(**placed(inference_group, i, c.ray_inference_cpus_per_worker, float(tp))).remote(
                backend, inference_context, inference_settings, i, str(self.run_dir), c.ray_inference_cpus_per_worker
            )
            for i in range(servers)
        ]
        self.trainers = [
            trainer_actor.options(
                **placed(trainer_group, r, c.ray_trainer_cpus_per_worker, 1.0 if gpu else 0.0)
            ).remote(
                c.train_backend,
                trainer_context,
                trainer_settings,
                algorithm,
                checkpoints,
                r,
                c.trainer_num_workers,
                c.ray_trainer_cpus_per_worker,
                torch_memory_interval_s=c.torch_memory_sample_interval_seconds,
            )
            for r in range(c.trainer_num_workers)
        ]
        log.info("placed %d inference servers (%s) and %d trainer ranks", servers, backend, c.trainer_num_workers)
        master_addr, master_port = ray.get(self.trainers[0].rendezvous_address.remote())
        setups = [t.setup.remote(master_addr, master_port) for t in self.trainers]
        urls = ray.get([s.base_url.remote() for s in self.servers])
        self.server_pids = [p for p in ray.get([s.pid.remote() for s in self.servers]) if p]
        ray.get(setups)
        log.info("servers up at %s; trainer ranks set up", urls)
        self.generation.clients = [InferenceClient(url, model=None, server_index=i) for i, url in enumerate(urls)]
        self._init_info = ray.get(
            self.trainers[0].prepare_sender.remote(
                self.transport_name,
                self.transport_context,
                self.transport_settings,
                servers * self.receivers_per_server,
            )
        )

    def _start_monitoring(
        self, backend: str, settings: PluginSettings | None, context: InferenceContext
    ) -> InferenceContext:
        """Node samplers, and the trace receiver for vLLM; returns the inference context (with its endpoint)."""
        from telescope.runtime.monitoring import start_node_samplers, start_trace_receiver

        c = self.config
        try:
            self.node_samplers = start_node_samplers(c.system_metrics_collection_interval_seconds, str(self.run_dir))
        except Exception as exc:  # monitoring must never stop the run
            log.warning("no system metrics: the node samplers could not start: %s", exc)
        if backend == "vllm" and getattr(settings, "enable_vllm_tracing", False):
            multi_node = sum(1 for n in ray.nodes() if n.get("Alive")) > 1
            port = int(getattr(settings, "otlp_receiver_port", 4318))
            self.trace_receiver, endpoint = start_trace_receiver(port, multi_node)
            if endpoint is not None:
                context = dataclasses.replace(context, traces_endpoint=endpoint)
        return context

    def infra_monitor(self) -> InfraMonitor:
        """The orchestrator's collector of system, torch memory and inference server metrics (start it in the loop)."""
        from telescope.runtime.monitoring import build_infra_monitor

        return build_infra_monitor(
            self.config, node_samplers=self.node_samplers, trainers=self.trainers, clients=self.generation.clients
        )

    async def connect_weights(self) -> None:
        """Connect every server to the weight transport (weights are pushed by the orchestrator)."""
        per_server = self.receivers_per_server
        settings = self.transport_settings.model_dump(mode="json") if self.transport_settings is not None else None
        context = self.transport_context.to_dict()
        await asyncio.gather(
            *(client.init_weight_transfer(self.transport_name, self._init_info, 1 + i * per_server, settings, context)
              for i, client in enumerate(self.generation.clients))
        )  # fmt: skip
        log.info("weight transport %s connected", self.transport_name)

    # -------------------------------------------------------------- services

    async def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        results = await asyncio.gather(*(t.train_step.remote(batch) for t in self.trainers))
        metrics: dict[str, float] = results[0]  # the backend already averages over ranks
        drained = await asyncio.gather(*(t.drain_events.remote() for t in self.trainers))
        for rank, records in enumerate(drained):
            publish_worker_events(records, component="trainer", rank=rank, step=batch.step)
        return metrics

    async def supervised_step(self, examples: list[SupervisedExample], learning_rate: float) -> dict[str, float]:
        results = await asyncio.gather(*(t.supervised_step.remote(examples, learning_rate) for t in self.trainers))
        metrics: dict[str, float] = results[0]
        return metrics

    async def push_weights(self, version: int, *, held_servers: Sequence[int] = ()) -> dict[str, float]:
        start = time.perf_counter()
        held = set(held_servers)
        sending = asyncio.gather(*(t.push_weights.remote(version) for t in self.trainers))
        receiving = asyncio.gather(
            *(client.update_weights(version, load=i not in held) for i, client in enumerate(self.generation.clients))
        )
        sent, received = await asyncio.gather(sending, receiving)
        for rank, record in enumerate(sent):
            publish_worker_events([record], component="trainer", rank=rank)
        inference_seconds = max(
            (float(r.get("seconds", 0.0)) for per_server in received for r in per_server if isinstance(r, dict)),
            default=0.0,
        )
        return {
            "timing_weight_sync_trainer_total": float(sent[0]["duration_s"]),
            "timing_weight_sync_inference_total": inference_seconds,
            "timing_weight_sync_wall": time.perf_counter() - start,
        }

    async def save_checkpoint(self, step: int) -> None:
        await asyncio.gather(*(t.save_checkpoint.remote(step) for t in self.trainers))

    async def load_checkpoint(self, path: Path) -> dict[str, Any]:
        metas = await asyncio.gather(*(t.load_checkpoint.remote(str(path)) for t in self.trainers))
        return dict(metas[0])

    # -------------------------------------------------------------- shutdown

    async def close(self) -> None:
        await self.generation.aclose()
        self.shutdown()

    def shutdown(self) -> None:
        """Stop servers, kill actors, free placement groups (safe to call twice)."""
        for server in self.servers:
            with contextlib.suppress(Exception):
                ray.get(server.stop.remote(), timeout=30)
        for trainer in self.trainers:
            with contextlib.suppress(Exception):
                ray.get(trainer.close.remote(), timeout=30)
        for actor in [*self.servers, *self.trainers, *self.node_samplers]:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if self.trace_receiver is not None:
            with contextlib.suppress(Exception):
                self.trace_receiver.stop()
            self.trace_receiver = None
        for pid in self.server_pids:  # a server whose actor died without stopping it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        for group in self.groups:
            with contextlib.suppress(Exception):
                remove_placement_group(group)
        self.servers, self.trainers, self.groups, self.server_pids = [], [], [], []
        self.node_samplers = []
