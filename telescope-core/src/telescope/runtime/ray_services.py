"""The run's workers on Ray: placement, actors, the inference clients, weight sync.

Ray is the only distributed engine; :mod:`telescope.runtime.ray_cluster` attaches to a
cluster or starts a private one. :class:`RayServices` then

- reserves a placement group per pool (``ray_*_placement_strategy``,
  ``ray_*_cpus_per_worker``, the custom resources of ``ray_*_resources_per_worker``
  (to pin a role to nodes that offer them), a GPU per trainer rank and
  ``inference_tensor_parallel_size`` GPUs per server when the cluster has GPUs,
  within ``ray_placement_timeout_s``), named after the run (``telescope-<run
  id>-<role>``, so runs sharing a cluster never clash), and places one actor per bundle;
- starts ``inference_num_workers / inference_tensor_parallel_size`` inference
  servers and ``trainer_num_workers`` trainer ranks (process group rendezvous at
  rank 0's node address). Each worker takes the address and the GPUs Ray gives it
  on its node (:mod:`telescope.runtime.workers`): a server binds loopback on the
  orchestrator's node and its node's address on another (``inference_host: auto``),
  and asks for the run token (:mod:`telescope.system.access`) made here for the
  servers and their clients; each placement is recorded as a ``worker.placed`` event
  (``component``, ``server`` or ``rank``, ``node``, ``url``, ``gpu_ids``), its
  start-up as a ``worker.startup`` event (the process's start to its readiness). A server
  on another node that listens on loopback only (``inference_host: 127.0.0.1``)
  is a clear error;
- starts the infrastructure monitoring (:mod:`telescope.runtime.monitoring`):
  a system sampler per node (a thread of the driver on its own node; on the others,
  actors created after the workers', which thus get the worker processes Ray has
  already started), torch memory sampling in each trainer rank, and with
  vLLM and ``enable_vllm_tracing`` the OTLP trace receiver whose address the
  servers get; :meth:`RayServices.infra_monitor` builds the orchestrator's
  collector of all of it;
- starts in two halves: :meth:`RayServices.start` places every worker and returns
  once the servers answer, while the trainer ranks go on setting up;
  :meth:`RayServices.start_trainers` waits for them in a task, connects the weight
  transport and starts the servers' supervision, and
  :meth:`RayServices.wait_ready` awaits it. So a fresh run's servers generate while
  the ranks start (the orchestrator's start-up);
- connects the weight transport (rank 0 sends, every server receives); the
  orchestrator then pushes the trainer's weights as version 0: before the first
  request after a resume or a warm start, and as soon as the ranks are ready in a
  fresh run, whose servers loaded the same model files. The
  transport learns the placement (``TransportContext.single_node``, ``sender_host``:
  rank 0's node). ``weight_transport: auto`` is ``nccl`` with GPUs, and on CPUs
  ``memory`` when rank 0 and every server share a node, else ``nccl`` (over gloo);
  ``memory`` with servers on other nodes is a clear error;
- is the orchestrator's :class:`~telescope.orchestrator.services.TrainingService`,
  and holds its :class:`~telescope.inference.generation.GenerationService`
  (``generation``: a :class:`~telescope.inference.generation.ServerPool` over the
  servers' clients).

Timeline events: after each step every rank's records (its phases per micro-batch)
are drained and published as ``trainer.<phase>`` with ``rank`` and ``step``; each
rank's ``weights.send`` is published when the weights are pushed; servers' weight
loads (``weights.load``) and requests (``inference.*``) are emitted by their clients.

Shutdown asks every server's worker to stop its server and every answering trainer
rank to close (together, in one bounded wait: :mod:`telescope.runtime.worker_shutdown`), kills every actor
(samplers included), stops the trace receiver and removes the placement groups; then the
run's shared-memory folders (:func:`~telescope.transports.shm_folders.remove_run_folders`),
whether rank 0 closed or not (also when a trainer group is replaced).
Nothing is killed by PID from the driver's host: a server process dies with its
worker, on the worker's node (:func:`telescope.system.processes.spawn`), so a
crashed or killed actor leaves no stray process. After SIGTERM to the process group
(``close(budget_s=...)``) the Ray cleanup gets a bounded time, and none when Ray's
GCS is already gone.

Faults (``docs/faults.md``): every request to a server has the read timeout
``inference_request_timeout_s``; a trainer rank that dies makes the trainer calls raise
:class:`~telescope.orchestrator.services.TrainerFailure` (at once, without waiting for
the other ranks). Restarting dead servers and trainer ranks, and the watchdog's probe,
are :mod:`telescope.runtime.ray_recovery`'s (``RayServices`` inherits them).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from telescope.api.events import publish_worker_events
from telescope.api.records import SupervisedExample, TrainingBatch
from telescope.inference.generation import ServerPool
from telescope.orchestrator.services import TrainerFailure, TrainingService
from telescope.recording.infra_monitor import InfraMonitor
from telescope.runtime.ray_cluster import RayStartError, gcs_reachable, reserve_workers, worker_bundle
from telescope.runtime.ray_recovery import PING_TIMEOUT_S, WorkerRecovery
from telescope.runtime.worker_deaths import death_reason, oom_kills
from telescope.runtime.worker_shutdown import bounded, stop_workers
from telescope.schema.config import TelescopeConfig
from telescope.system.access import new_run_token
from telescope.system.addressing import single_node
from telescope.transports.shm_folders import remove_run_folders

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from telescope.api.context import InferenceContext
    from telescope.api.settings import PluginSettings
    from telescope.inference.client import InferenceClient
    from telescope.runtime.supervisor import ServerSupervisor
    from telescope.runtime.workers import TrainStepResult

log = logging.getLogger("telescope.run.workers")


class RayServices(WorkerRecovery, TrainingService):
    """Trainer ranks and inference servers as Ray actors (see the module docstring)."""

    can_restart_trainer: ClassVar[bool] = True  # WorkerRecovery.restart_trainer

    def __init__(self, config: TelescopeConfig, run_dir: Path) -> None:
        self.config = config
        self.run_dir = run_dir
        self.trainers: list[Any] = []
        self.servers: list[Any] = []
        self.generation = ServerPool([], config.vllm_scheduling_policy)
        #: names this run's placement groups in a shared cluster (``telescope-<run id>-<role>``)
        self.run_id = f"{run_dir.name}-{uuid.uuid4().hex[:8]}"
        #: the run token every server asks for (:mod:`telescope.system.access`); in memory only
        self.access_token = new_run_token()
        #: where each worker runs (``placement()`` of each server and rank)
        self.server_placements: list[dict[str, Any]] = []
        self.trainer_placements: list[dict[str, Any]] = []
        self.groups: list[PlacementGroup] = []
        self.transport_name = ""
        self.receivers_per_server = 1
        self.node_samplers: list[Any] = []
        self.trace_receiver: Any = None
        self.supervisor: ServerSupervisor | None = None
        self.trainer_restarts = 0
        self._new_server: Callable[[int], Any] | None = None  # an actor for server i on its bundle
        self._new_trainer: Callable[[int], Any] | None = None  # an actor for rank r on its bundle
        self._setups: list[Any] = []  # the ranks' set-up calls, which start() submits
        self._gpu = False  # whether the cluster has GPUs (start() looks)
        self._trainers_ready: asyncio.Future[None] | None = None  # start_trainers()'s task
        self._weights = asyncio.Condition()
        self._pushed_version: int | None = None  # the version every available server holds
        self._oom_kills_at_start = oom_kills()  # a rank's death is out of memory only if this count rose
        self._trainer_ahead = False  # the trainer stepped since that version was pushed

    # ----------------------------------------------------------------- start

    def start(self) -> None:
        """Place every worker and return once the servers answer; the trainer ranks go on setting up.

        Blocking (run it in a thread). ``generation`` then has its clients, so the servers
        can take requests; :meth:`start_trainers` waits for the ranks.
        """
        from telescope.api.context import InferenceContext, TrainerContext
        from telescope.inference import default_backend_name
        from telescope.plugins.facade import get_plugins
        from telescope.plugins.registry import PluginKind
        from telescope.runtime.workers import InferenceWorker, TrainerWorker
        from telescope.system.addressing import unreachable_server
        from telescope.trainer.checkpoint import TrainerCheckpoints

        c = self.config
        plugins = get_plugins()
        gpu = ray.cluster_resources().get("GPU", 0) > 0
        backend = default_backend_name(gpu) if c.inference_backend == "auto" else c.inference_backend
        inference_context = dataclasses.replace(InferenceContext.from_config(c), access_token=self.access_token)
        # inference_host: auto binds each server where the orchestrator (this process) reaches it
        orchestrator_node = ray.util.get_node_ip_address() if c.inference_host == "auto" else None
        inference_settings = plugins.settings_for(PluginKind.INFERENCE_BACKEND, backend, c)
        inference_context = self._start_trace_receiver(backend, inference_settings, inference_context)
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
        inference_bundle = worker_bundle(
            c.ray_inference_cpus_per_worker, float(tp), c.ray_inference_resources_per_worker
        )
        inference_group = reserve_workers(
            "inference",
            f"telescope-{self.run_id}-inference",
            servers,
            inference_bundle,
            c.ray_inference_placement_strategy,
            c.ray_placement_timeout_s,
        )
        self.groups.append(inference_group)
        trainer_bundle = worker_bundle(
            c.ray_trainer_cpus_per_worker, 1.0 if gpu else 0.0, c.ray_trainer_resources_per_worker
        )
        trainer_group = reserve_workers(
            "trainer",
            f"telescope-{self.run_id}-trainer",
            c.trainer_num_workers,
            trainer_bundle,
            c.ray_trainer_placement_strategy,
            c.ray_placement_timeout_s,
        )
        self.groups.append(trainer_group)

        def placed(group: PlacementGroup, index: int, cpus: float, gpus: float) -> dict[str, Any]:
            return {
                "num_cpus": cpus,
                "num_gpus": gpus,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index),
            }

        inference_actor: Any = InferenceWorker  # a Ray actor class (its .options is added by @ray.remote)
        trainer_actor: Any = TrainerWorker

        def new_server(i: int) -> Any:  # also what a restart uses: the same bundle, so the same placement
            return inference_actor.options(
                **placed(inference_group, i, c.ray_inference_cpus_per_worker, float(tp))
            ).remote(
                backend,
                inference_context,
                inference_settings,
                i,
                str(self.run_dir),
                c.ray_inference_cpus_per_worker,
                orchestrator_node,
            )

        def new_trainer(r: int) -> Any:
            return trainer_actor.options(
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

        self._new_server, self._new_trainer = new_server, new_trainer
        self.servers = [new_server(i) for i in range(servers)]
        self.trainers = [new_trainer(r) for r in range(c.trainer_num_workers)]
        # After the workers: the first actors get the worker processes Ray started for the run
        # as it began (a new one takes 1-2 s to start, one per CPU at a time), and the trainer
        # rank's start-up is the run's critical path.
        self._start_node_samplers()
        log.info("placed %d inference servers (%s) and %d trainer ranks", servers, backend, c.trainer_num_workers)
        master_addr, master_port = ray.get(self.trainers[0].rendezvous_address.remote())
        self._setups = [t.setup.remote(master_addr, master_port) for t in self.trainers]
        self.server_placements = ray.get([s.placement.remote() for s in self.servers])
        problem = unreachable_server(self.server_placements, ray.util.get_node_ip_address(), c.inference_host)
        if problem:
            raise RayStartError(problem)
        urls = [p["url"] for p in self.server_placements]
        log.info("servers up at %s; the trainer ranks are setting up", urls)
        self.generation.clients = [self._client(url, i) for i, url in enumerate(urls)]
        self._gpu = gpu

    def _client(self, url: str, index: int) -> InferenceClient:
        """The orchestrator's client of server ``index`` (with the run token and the request timeout)."""
        from telescope.inference.client import InferenceClient

        timeout = self.config.inference_request_timeout_s
        return InferenceClient(
            url, model=None, server_index=index, read_timeout=timeout, access_token=self.access_token
        )

    def start_trainers(self, on_fatal: Callable[[BaseException], None], started: float) -> None:
        """After :meth:`start`, in the loop, a task :meth:`wait_ready` awaits: the ranks' set-up, then
        :meth:`connect_weights` and :meth:`supervise`; ``run.workers_start`` spans ``started`` to its end."""
        from telescope.api import events

        async def finish() -> None:
            fields: dict[str, Any] = {"component": "orchestrator"}
            try:
                await asyncio.to_thread(self._finish_trainers)
                await self.connect_weights()
                self.supervise(on_fatal)
            except BaseException as exc:
                fields["error"] = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                events.emit("run.workers_start", start=started, duration_s=time.time() - started, **fields)

        self._trainers_ready = asyncio.ensure_future(finish())

    async def wait_ready(self) -> None:
        """The :class:`~telescope.orchestrator.services.TrainingService` start: until :meth:`start_trainers` ends."""
        if self._trainers_ready is None:
            raise RuntimeError("RayServices.start_trainers() was not called after start()")
        await asyncio.shield(self._trainers_ready)

    def _finish_trainers(self) -> None:
        """Wait for the ranks' set-up (blocking: run in a thread), then prepare rank 0's sending end."""
        from telescope.api.context import TransportContext
        from telescope.plugins.facade import get_plugins
        from telescope.plugins.registry import PluginKind
        from telescope.runtime.monitoring import record_placements

        c = self.config
        plugins = get_plugins()
        servers = len(self.servers)
        self.trainer_placements = ray.get([t.placement.remote() for t in self.trainers])
        record_placements(self.server_placements, self.trainer_placements)
        ray.get(self._setups)
        log.info("trainer ranks set up on %s", [p["node"] for p in self.trainer_placements])
        gpu = self._gpu
        one_node = single_node(self.trainer_placements[0], self.server_placements)
        self.transport_name = self._transport_name(gpu, one_node)
        self.transport_settings = plugins.settings_for(PluginKind.WEIGHT_TRANSPORT, self.transport_name, c)
        self.transport_context = dataclasses.replace(
            TransportContext.from_config(c),
            sender_host=self.trainer_placements[0]["node"],
            single_node=one_node,
            run_id=self.run_id,
        )
        self._init_info = ray.get(
            self.trainers[0].prepare_sender.remote(
                self.transport_name,
                self.transport_context,
                self.transport_settings,
                servers * self.receivers_per_server,
            )
        )

    def _transport_name(self, gpu: bool, one_node: bool) -> str:
        """``weight_transport``, with ``auto`` resolved for this placement (see the module docstring)."""
        from telescope.system.addressing import memory_transport_error
        from telescope.transports import default_transport_name

        name = self.config.weight_transport
        if name == "auto":
            return default_transport_name(gpu, multi_node=not one_node)
        if name == "memory" and not one_node:
            raise RayStartError(memory_transport_error(self.trainer_placements[0], self.server_placements))
        return name

    def _start_node_samplers(self) -> None:
        """One system-metrics sampler per node (:func:`telescope.runtime.monitoring.start_node_samplers`)."""
        from telescope.runtime.monitoring import start_node_samplers

        try:
            interval = self.config.system_metrics_collection_interval_seconds
            self.node_samplers = start_node_samplers(interval, str(self.run_dir))
        except Exception as exc:  # monitoring must never stop the run
            log.warning("no system metrics: the node samplers could not start: %s", exc)

    def _start_trace_receiver(
        self, backend: str, settings: PluginSettings | None, context: InferenceContext
    ) -> InferenceContext:
        """The trace receiver for vLLM; returns the inference context (with its endpoint)."""
        from telescope.runtime.monitoring import start_trace_receiver

        if backend == "vllm" and getattr(settings, "enable_vllm_tracing", False):
            multi_node = sum(1 for n in ray.nodes() if n.get("Alive")) > 1
            port = int(getattr(settings, "otlp_receiver_port", 4318))
            self.trace_receiver, endpoint = start_trace_receiver(port, multi_node, context.access_token)
            if endpoint is not None:
                context = dataclasses.replace(context, traces_endpoint=endpoint)
        return context

    def infra_monitor(self) -> InfraMonitor:
        """The orchestrator's collector of system, torch memory and inference server metrics (start it in the loop)."""
        from telescope.runtime.monitoring import build_infra_monitor

        return build_infra_monitor(
            self.config, node_samplers=self.node_samplers, trainers=self.trainers, clients=self.generation.clients
        )

    async def connect_weights(self, servers: Sequence[int] | None = None) -> None:
        """Connect every server (or ``servers``) to the weight transport (weights are pushed by the orchestrator)."""
        import httpx

        per_server = self.receivers_per_server
        settings = self.transport_settings.model_dump(mode="json") if self.transport_settings is not None else None
        context = self.transport_context.to_dict()

        async def connect(i: int) -> None:
            client = self.generation.clients[i]
            try:
                await client.init_weight_transfer(
                    self.transport_name, self._init_info, 1 + i * per_server, settings, context
                )
            except httpx.TransportError as exc:  # it died meanwhile: its restart connects it
                if self.supervisor is None:
                    raise
                log.warning("inference server %d did not connect to the weight transport: %s", i, exc)
                self.supervisor.check_soon(i)

        indices = range(len(self.generation.clients)) if servers is None else servers
        await asyncio.gather(*(connect(i) for i in indices))
        log.info("weight transport %s connected", self.transport_name)

    # -------------------------------------------------------------- services

    def _submit(self, call: Callable[[Any], Any], ranks: int | None = None) -> list[asyncio.Future[Any]]:
        """``call(actor)`` on every rank (or the first ``ranks``), submitted now."""
        return [asyncio.ensure_future(_awaited(call(t))) for t in self.trainers[:ranks]]

    async def _collect(self, what: str, tasks: list[asyncio.Future[Any]]) -> list[Any]:
        """The ranks' results; a rank that died raises :class:`TrainerFailure` at once (not after the others)."""
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for rank, task in enumerate(tasks):
                error = task.exception() if task.done() else None
                if isinstance(error, ray.exceptions.RayActorError):
                    log.debug("trainer rank %d: Ray reports: %s", rank, error)  # its list of possible causes
                    why = death_reason(error, self._oom_kills_at_start, self.trainer_placements[rank : rank + 1])
                    raise TrainerFailure(f"trainer rank {rank} died during {what}: {why}")
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:  # the others, when one rank died: the restart kills their actors
                task.cancel()

    async def _on_ranks(self, what: str, call: Callable[[Any], Any], ranks: int | None = None) -> list[Any]:
        return await self._collect(what, self._submit(call, ranks))

    async def _step(self, what: str, call: Callable[[Any], Any]) -> list[Any]:
        """A call that changes the trainer's weights: after any weight resync in progress (which pushes the
        weights of the last pushed version, so must reach the ranks first)."""
        async with self._weights:
            self._trainer_ahead = True
            tasks = self._submit(call)
        return await self._collect(what, tasks)

    async def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        """One round trip to the ranks: each answers the step's metrics with its timeline records."""
        results: list[TrainStepResult] = await self._step(
            f"training step {batch.step}", lambda t: t.train_step.remote(batch)
        )
        for rank, result in enumerate(results):
            publish_worker_events(result.events, component="trainer", rank=rank, step=batch.step)
        return results[0].metrics  # the backend already averages over ranks

    async def supervised_step(self, examples: list[SupervisedExample], learning_rate: float) -> dict[str, float]:
        results = await self._step("a warm-start step", lambda t: t.supervised_step.remote(examples, learning_rate))
        metrics: dict[str, float] = results[0]
        return metrics

    async def push_weights(self, version: int, *, held_servers: Sequence[int] = ()) -> dict[str, float]:
        async with self._weights:
            return await self._push(version, held=held_servers)

    def _serving(self, also: int | None = None) -> list[int]:
        """The servers that take work now, and ``also`` (a server being restarted)."""
        pool = self.generation
        return [i for i in range(len(pool.clients)) if pool.is_available(i) or i == also]

    async def _push(self, version: int, also: int | None = None, held: Sequence[int] = ()) -> dict[str, float]:
        """Send ``version`` to the servers in service and ``also`` (hold ``_weights``); one that fails is checked.

        Servers in ``held`` take part in the transfer but keep their weights (an eval server mid-eval).
        """
        start = time.perf_counter()
        servers = self._serving(also)
        held_set = set(held)
        sending = self._on_ranks(f"pushing weights version {version}", lambda t: t.push_weights.remote(version))
        receiving = asyncio.gather(*(self._receive(i, version, load=i not in held_set) for i in servers))
        sent, received = await asyncio.gather(sending, receiving)
        for rank, record in enumerate(sent):
            publish_worker_events([record], component="trainer", rank=rank)
        self._pushed_version, self._trainer_ahead = version, False
        self._weights.notify_all()
        inference_seconds = max(
            (float(r.get("seconds", 0.0)) for per_server in received for r in per_server if isinstance(r, dict)),
            default=0.0,
        )
        return {
            "timing_weight_sync_trainer_total": float(sent[0]["duration_s"]),
            "timing_weight_sync_inference_total": inference_seconds,
            "timing_weight_sync_wall": time.perf_counter() - start,
        }

    async def _receive(self, server: int, version: int, *, load: bool = True) -> list[Any]:
        import httpx

        try:
            return await self.generation.clients[server].update_weights(version, load=load)
        except httpx.TransportError as exc:  # the server died: it gets the weights when it is restarted
            if self.supervisor is None:
                raise
            log.warning("inference server %d did not take weights version %d: %s", server, version, exc)
            self.supervisor.check_soon(server)
            return []

    async def save_checkpoint(self, step: int) -> None:
        await self._on_ranks(f"saving checkpoint {step}", lambda t: t.save_checkpoint.remote(step))

    async def load_checkpoint(self, path: Path) -> dict[str, Any]:
        metas = await self._on_ranks(f"loading {path.name}", lambda t: t.load_checkpoint.remote(str(path)))
        return dict(metas[0])

    # -------------------------------------------------------------- shutdown

    async def close(self, budget_s: float | None = None) -> None:
        """Stop everything; with ``budget_s`` (after SIGTERM) the Ray part gets at most that many seconds."""
        if self._trainers_ready is not None:
            if not self._trainers_ready.done():  # the run ended during start-up
                self._trainers_ready.cancel()
            elif not self._trainers_ready.cancelled():
                self._trainers_ready.exception()  # retrieved: the run already failed on it, or on something else
        if self.supervisor is not None:
            await self.supervisor.stop()
        await self.generation.aclose()
        try:
            if budget_s is None:
                self.shutdown()
            elif gcs_reachable():  # server processes die with their workers (PR_SET_PDEATHSIG), wherever those run
                await asyncio.to_thread(bounded, budget_s, self.shutdown)
            else:
                log.warning("Ray's GCS is gone (SIGTERM to the process group?): skipping the Ray cleanup")
        finally:  # whether rank 0 closed its transport or not, nothing of the run stays in shared memory
            remove_run_folders(self.run_id)

    def shutdown(self) -> None:
        """Stop servers (each on its node, by its worker), kill actors, free placement groups (safe to call twice).

        Graceful stops and kills: :func:`telescope.runtime.worker_shutdown.stop_workers`.
        """
        from telescope.runtime.monitoring import stop_node_samplers

        stop_workers(self.servers, self.trainers, stop_node_samplers(self.node_samplers), PING_TIMEOUT_S)
        if self.trace_receiver is not None:
            with contextlib.suppress(Exception):
                self.trace_receiver.stop()
            self.trace_receiver = None
        for group in self.groups:
            with contextlib.suppress(Exception):
                remove_placement_group(group)
        self.servers, self.trainers, self.groups = [], [], []
        self.node_samplers = []


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable
