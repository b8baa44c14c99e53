"""The Ray actors of a run: one per trainer rank, one per inference worker.

:class:`TrainerWorker` owns one rank of the trainer backend (FSDP, Megatron, a
plugin): the process group, the model shard, the optimizer, and, on rank 0, the
sending end of the weight transport. :class:`InferenceWorker` starts one inference
server through the inference backend (the embedded engine or vLLM) and holds the
Ray resources (CPUs, GPUs, placement) the server runs on; it stops the server when
asked or when the actor exits.

Both receive what their plugin needs and nothing more: the plugin's name, its
own settings and its narrow context (and the trainer the algorithm, already
built, and where checkpoints go), so a worker never re-reads files, re-applies
defaults or sees the whole config. Torch's intra-op threads follow the CPUs Ray
gives the actor.

Where they run is Ray's choice, and each worker works from what Ray tells it, on
its own node: an inference worker publishes its node's address
(``ray.util.get_node_ip_address()``, as ``TELESCOPE_NODE_IP``) so its server's URL is
that address (:mod:`telescope.system.addressing`), and hands its backend the GPU ids
Ray assigned it (``InferenceContext.gpu_ids``); a trainer rank selects the CUDA
device that is its assigned id (``LOCAL_RANK``, :mod:`telescope.system.devices`)
and, when the rendezvous is on another address, binds gloo to the interface that
reaches it (``GLOO_SOCKET_IFNAME``). :meth:`placement` reports node, GPUs and pid.
Each ends when its node's raylet is gone (:mod:`telescope.runtime.worker_lifetime`).

A trainer rank writes its Python logging and stdout/stderr to
``<run_dir>/logs/trainer_<rank>.log`` (:mod:`telescope.recording.run_logs`). Its
timeline records (the backend's phases; ``weights.send``, returned by
:meth:`TrainerWorker.push_weights`) go back to the orchestrator as dicts, which puts
them on the run's event bus with the rank and step.

Each trainer rank samples its torch memory (CUDA allocator statistics of its
device, else the process's resident memory) every ``torch_memory_interval_s`` in a
thread; the orchestrator takes the samples with
:meth:`TrainerWorker.drain_torch_memory`, which runs in the ``monitor`` concurrency
group: it answers while a training step runs. (With a concurrency group Ray runs
the other methods on one dedicated thread, always the same, so per-thread state
such as the CUDA device set in ``setup`` persists from call to call.)
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from telescope.runtime.worker_lifetime import exit_with_raylet
from telescope.system.garbage_collection import freeze_startup_objects

if TYPE_CHECKING:
    from telescope.api.algorithm import Algorithm
    from telescope.api.context import InferenceContext, TrainerContext, TransportContext
    from telescope.api.records import SupervisedExample
    from telescope.api.settings import PluginSettings
    from telescope.api.transport import WeightTransport
    from telescope.trainer.checkpoint import TrainerCheckpoints


def _process_started_at() -> float:
    """When this worker's process started (wall clock): where its start-up span begins."""
    import psutil

    return float(psutil.Process().create_time())


def _limit_threads(cpus: float) -> None:
    import torch

    torch.set_num_threads(max(1, int(cpus)))


@dataclasses.dataclass(frozen=True)
class TrainStepResult:
    """A rank's answer to a training step: the step's metrics (averaged over the ranks by the
    backend) and the rank's timeline records since the last step (its phases per micro-batch)."""

    metrics: dict[str, float]
    events: list[dict[str, Any]]


@ray.remote(concurrency_groups={"monitor": 1})  # type: ignore[call-overload]  # Ray's stubs omit the option
class TrainerWorker:
    """One trainer rank."""

    def __init__(
        self,
        backend: str,
        context: TrainerContext,
        settings: PluginSettings | None,
        algorithm: Algorithm,
        checkpoints: TrainerCheckpoints,
        rank: int,
        world_size: int,
        cpus: float,
        torch_memory_interval_s: float | None = None,
    ) -> None:
        from telescope.plugins.facade import get_plugins
        from telescope.recording.run_logs import capture_process_logs
        from telescope.recording.system_metrics import PeriodicSampler, torch_memory_sample

        exit_with_raylet()
        self._release_logs = capture_process_logs(context.run_dir, f"trainer_{rank}") if context.run_dir else None
        _limit_threads(cpus)
        self.rank = rank
        self.world_size = world_size
        self._started_at = _process_started_at()
        self._ready_at: float | None = None  # set-up done (see placement)
        self._port_reservation: socket.socket | None = None  # rank 0: the group's port, until setup
        self.checkpoints = checkpoints
        self.backend = get_plugins().trainer_backend(backend)(context, algorithm, settings)
        self.transport: WeightTransport | None = None
        self._log = logging.getLogger("telescope.trainer")
        self._log.info("trainer rank %d of %d: backend %s (pid %d)", rank, world_size, backend, os.getpid())
        self._cuda_device: int | None = None
        self._memory: PeriodicSampler | None = None
        if torch_memory_interval_s:
            self._memory = PeriodicSampler(
                lambda: torch_memory_sample(self._cuda_device), torch_memory_interval_s, name=f"torch-memory-{rank}"
            ).start()

    def rendezvous_address(self) -> tuple[str, int]:
        """(host, port) for the process group; asked of rank 0.

        The port stays reserved (:func:`~telescope.trainer.distributed.reserve_port`) until
        this rank's :meth:`setup` has formed the group, so no other process on the node
        takes it in between.
        """
        from telescope.trainer.distributed import reserve_port

        if self._port_reservation is None:
            self._port_reservation = reserve_port()
        return ray.util.get_node_ip_address(), int(self._port_reservation.getsockname()[1])

    def placement(self) -> dict[str, Any]:
        """Where this rank runs: ``node`` (Ray's address of it), ``gpu_ids`` (Ray's assignment), ``pid``.

        Also its start-up: ``started_at`` (the process's start) and ``ready_at`` (set-up's end,
        None before it; asked after ``setup``, the call queues behind it).
        """
        from telescope.system.devices import ray_gpu_ids

        return {
            "node": ray.util.get_node_ip_address(),
            "gpu_ids": list(ray_gpu_ids() or ()),
            "pid": os.getpid(),
            "started_at": self._started_at,
            "ready_at": self._ready_at,
        }

    def setup(self, master_addr: str, master_port: int) -> None:
        from telescope.system.addressing import interface_of, is_loopback, local_address_towards
        from telescope.system.devices import local_cuda_index, ray_gpu_ids

        os.environ["MASTER_ADDR"] = master_addr
        os.environ["MASTER_PORT"] = str(master_port)
        local = local_cuda_index(ray_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        if local is not None:  # the GPU Ray assigned this rank, not rank % device count
            os.environ["LOCAL_RANK"] = str(local)
        if not is_loopback(master_addr) and "GLOO_SOCKET_IFNAME" not in os.environ:
            interface = interface_of(local_address_towards(master_addr))
            if interface is not None:  # gloo's default is the hostname's address, often loopback
                os.environ["GLOO_SOCKET_IFNAME"] = interface
        try:
            self.backend.setup(self.rank, self.world_size)
        finally:
            if self._port_reservation is not None:
                self._port_reservation.close()
                self._port_reservation = None
        freeze_startup_objects(f"trainer rank {self.rank}")
        self._ready_at = time.time()
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self._cuda_device = torch.cuda.current_device()  # the device setup chose, for the memory sampler

    def prepare_sender(
        self, transport: str, context: TransportContext, settings: PluginSettings | None, num_receivers: int
    ) -> dict[str, Any]:
        """Rank 0: create the transport's sending end (a new one replaces the last); returns what receivers need."""
        from telescope.plugins.facade import get_plugins

        if self.transport is not None:  # reconnecting after a restart: the old sender's buffers go
            self.transport.close()
        self.transport = get_plugins().weight_transport(transport)(context, settings)
        info: dict[str, Any] = self.transport.prepare_sender(num_receivers)
        return info

    def train_step(self, batch: Any) -> TrainStepResult:
        """One training step: its metrics and this rank's timeline records, in one answer (one round trip)."""
        metrics: dict[str, float] = self.backend.train_step(batch)
        self._log.info(
            "step %s: loss %.4g, %.2f s",
            getattr(batch, "step", "?"),
            metrics.get("loss", float("nan")),
            metrics.get("timing_trainer_step_total", float("nan")),
        )
        return TrainStepResult(metrics=metrics, events=self.backend.drain_events())

    def supervised_step(self, examples: list[SupervisedExample], learning_rate: float) -> dict[str, float]:
        metrics: dict[str, float] = self.backend.supervised_step(examples, learning_rate)
        return metrics

    def push_weights(self, version: int) -> dict[str, Any]:
        """Gather the full weights (collective on every rank); rank 0 sends them.

        Returns this rank's ``weights.send`` record: ``start``, ``duration_s``,
        ``version``, ``tensors``, ``bytes`` and ``sender`` (whether this rank sent).
        """
        wall, start = time.time(), time.perf_counter()
        counted = [0, 0]

        def counting(weights: Any) -> Any:
            for name, tensor in weights:
                counted[0] += 1
                counted[1] += tensor.numel() * tensor.element_size()
                yield name, tensor

        weights = counting(self.backend.named_weights())
        sender = self.rank == 0 and self.transport is not None
        if sender:
            assert self.transport is not None
            self.transport.send(weights, version)
        else:
            for _ in weights:  # every rank takes part in gathering each tensor
                pass
        record = {
            "kind": "weights.send",
            "start": wall,
            "duration_s": time.perf_counter() - start,
            "version": version,
            "tensors": counted[0],
            "bytes": counted[1],
            "sender": sender,
        }
        return record

    def save_checkpoint(self, step: int) -> str:
        return str(self.checkpoints.save(self.backend, step))

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        meta: dict[str, Any] = self.backend.load_checkpoint(Path(path))
        return meta

    @ray.method(concurrency_group="monitor")
    def ping(self) -> dict[str, Any]:
        """This rank's ids; answers during a training step (the watchdog asks which ranks still answer)."""
        return {"rank": self.rank, "node": ray.util.get_node_ip_address(), "pid": os.getpid()}

    @ray.method(concurrency_group="monitor")
    def drain_torch_memory(self) -> dict[str, Any]:
        """The torch memory samples taken since the last drain (answers during a training step)."""
        samples = self._memory.drain() if self._memory is not None else []
        return {"rank": self.rank, "node": ray.util.get_node_ip_address(), "pid": os.getpid(), "samples": samples}

    def close(self) -> None:
        if self._memory is not None:
            self._memory.stop()
        if self.transport is not None:
            self.transport.close()
        self.backend.close()
        if self._release_logs is not None:
            self._release_logs()
            self._release_logs = None


@ray.remote
class InferenceWorker:
    """One inference server, started through the configured inference backend.

    ``orchestrator_node`` (``inference_host: auto``): the node of the orchestrator, the
    servers' one HTTP client; the server binds loopback on that node, this node's
    address on another (:func:`~telescope.system.addressing.server_bind_host`). None
    keeps the context's ``host``.
    """

    def __init__(
        self,
        backend: str,
        context: InferenceContext,
        settings: PluginSettings | None,
        index: int,
        run_dir: str | None,
        cpus: float,
        orchestrator_node: str | None = None,
    ) -> None:
        from telescope.plugins.facade import get_plugins
        from telescope.system.addressing import NODE_IP_ENV, server_bind_host
        from telescope.system.devices import ray_gpu_ids

        exit_with_raylet()
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, int(cpus))))
        self.node = ray.util.get_node_ip_address()
        os.environ[NODE_IP_ENV] = self.node  # a wildcard-bound server is reached at this node's address
        if orchestrator_node is not None:  # inference_host: auto
            context = dataclasses.replace(context, host=server_bind_host(self.node, orchestrator_node))
        self.gpu_ids = ray_gpu_ids()
        if self.gpu_ids:  # the devices Ray assigned this worker (the backend must not pick others)
            context = dataclasses.replace(context, gpu_ids=self.gpu_ids)
        backend_class = get_plugins().inference_backend(backend)
        self._backend = backend_class(context, settings)
        self._index = index
        self._run_dir = Path(run_dir) if run_dir else None
        self._started_at = _process_started_at()
        self.server = self._backend.start_server(index, self._run_dir)
        self._ready_at = time.time()  # start_server returns once the server answers

    def base_url(self) -> str:
        return str(self.server.address.base_url)

    def placement(self) -> dict[str, Any]:
        """Where this server runs: ``node``, ``url``, ``gpu_ids`` (Ray's assignment), ``pid`` (the server's).

        Also its start-up: ``started_at`` (this worker's process start) and ``ready_at`` (when
        its server first answered).
        """
        return {
            "node": self.node,
            "url": self.base_url(),
            "gpu_ids": list(self.gpu_ids or ()),
            "pid": self.pid(),
            "started_at": self._started_at,
            "ready_at": self._ready_at,
        }

    def pid(self) -> int | None:
        process = getattr(self.server, "process", None)
        return int(process.pid) if process is not None else None

    def alive(self) -> bool:
        """Whether the server's process still runs (True for a server with no process of its own)."""
        process = getattr(self.server, "process", None)
        return process is None or process.poll() is None

    def restart(self) -> str:
        """Stop the server (if anything is left of it) and start it again here; returns its URL."""
        try:
            self.server.stop()
        except Exception as exc:  # a dead server may not stop cleanly; the new one starts regardless
            logging.getLogger("telescope.inference").warning("stopping inference server %d: %s", self._index, exc)
        self.server = self._backend.start_server(self._index, self._run_dir)
        return self.base_url()

    def stop(self) -> None:
        self.server.stop()
