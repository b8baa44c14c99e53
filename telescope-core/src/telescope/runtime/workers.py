"""The Ray actors of a run: one per trainer rank, one per inference worker.

:class:`TrainerWorker` owns one rank of the trainer backend (FSDP, Megatron, a
plugin): the process group, the model shard, the optimizer, and, on rank 0, the
sending end of the weight transport. :class:`InferenceWorker` starts one inference
server through the inference backend (the embedded engine or vLLM) and holds the
Ray resources (CPUs, GPUs, placement) the server runs on; it stops the server when
asked or when the actor exits.

Both take the resolved config as JSON, so they never re-read files or re-apply
defaults. Torch's intra-op threads follow the CPUs Ray gives the actor.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import ray


def _config(config_json: str) -> Any:
    from telescope.config.schema import TelescopeConfig

    return TelescopeConfig.model_validate_json(config_json)


def _limit_threads(cpus: float) -> None:
    import torch

    torch.set_num_threads(max(1, int(cpus)))


@ray.remote
class TrainerWorker:
    """One trainer rank."""

    def __init__(self, config_json: str, rank: int, world_size: int, cpus: float) -> None:
        from telescope.algorithms.factory import build_algorithm
        from telescope.plugins.manager import get_plugin_manager
        from telescope.plugins.registry import PluginKind

        _limit_threads(cpus)
        self.config = _config(config_json)
        self.rank = rank
        self.world_size = world_size
        backend_class = get_plugin_manager().registry.get(PluginKind.TRAINER_BACKEND, self.config.train_backend)
        self.backend = backend_class(self.config, build_algorithm(self.config))
        self.transport: Any = None

    def rendezvous_address(self) -> tuple[str, int]:
        """(host, free port) for the process group; asked of rank 0."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = int(sock.getsockname()[1])
        return ray.util.get_node_ip_address(), port

    def setup(self, master_addr: str, master_port: int) -> None:
        os.environ["MASTER_ADDR"] = master_addr
        os.environ["MASTER_PORT"] = str(master_port)
        self.backend.setup(self.rank, self.world_size)

    def prepare_sender(self, transport_name: str, num_receivers: int) -> dict[str, Any]:
        """Rank 0: create the transport's sending end; returns what receivers need to connect."""
        from telescope.plugins.manager import get_plugin_manager
        from telescope.plugins.registry import PluginKind

        transport_class = get_plugin_manager().registry.get(PluginKind.WEIGHT_TRANSPORT, transport_name)
        self.transport = transport_class(self.config)
        info: dict[str, Any] = self.transport.prepare_sender(num_receivers)
        return info

    def train_step(self, batch: Any) -> dict[str, float]:
        metrics: dict[str, float] = self.backend.train_step(batch)
        return metrics

    def push_weights(self, version: int) -> float:
        """Gather the full weights (collective on every rank); rank 0 sends them. Returns seconds."""
        import time

        start = time.perf_counter()
        weights = self.backend.named_weights()
        if self.rank == 0 and self.transport is not None:
            self.transport.send(weights, version)
        else:
            for _ in weights:  # every rank takes part in gathering each tensor
                pass
        return time.perf_counter() - start

    def save_checkpoint(self, step: int) -> str:
        from telescope.trainer.checkpoint import CheckpointManager

        return str(CheckpointManager.from_config(self.config).save(self.backend, step))

    def load_checkpoint(self, path: str) -> dict[str, Any]:
        meta: dict[str, Any] = self.backend.load_checkpoint(Path(path))
        return meta

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.backend.close()


@ray.remote
class InferenceWorker:
    """One inference server, started through the configured inference backend."""

    def __init__(self, config_json: str, backend_name: str, index: int, run_dir: str | None, cpus: float) -> None:
        from telescope.plugins.manager import get_plugin_manager
        from telescope.plugins.registry import PluginKind

        self.config = _config(config_json)
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, int(cpus))))
        backend_class = get_plugin_manager().registry.get(PluginKind.INFERENCE_BACKEND, backend_name)
        self.server = backend_class(self.config).start_server(index, Path(run_dir) if run_dir else None)

    def base_url(self) -> str:
        return str(self.server.address.base_url)

    def pid(self) -> int | None:
        process = getattr(self.server, "process", None)
        return int(process.pid) if process is not None else None

    def stop(self) -> None:
        self.server.stop()
