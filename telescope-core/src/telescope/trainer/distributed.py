"""Process-group setup and the few collectives the trainer needs.

CPU runs use gloo, CUDA runs NCCL. The group is created from ``MASTER_ADDR`` /
``MASTER_PORT``; a single rank without ``MASTER_PORT`` uses an in-process store
and binds no port, and torn down with a ``barrier()`` first: gloo may abort at exit otherwise.
Every collective is a no-op when no process group exists.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

import torch
import torch.distributed as dist


def reserve_port(host: str = "") -> socket.socket:
    """A TCP port for a process group's store, held until the store listens on it.

    Returns a socket bound to a port the system chose (read it with
    ``getsockname()[1]``) and not listening, with ``SO_REUSEADDR``: rank 0's store
    binds the same port (libuv's bind sets ``SO_REUSEADDR`` too, and Linux lets two
    such sockets share a port while neither listens), while any other process's bind
    or outgoing connection is kept off it. The caller closes the socket once the group
    has formed. Choosing a free port, closing it and handing its number on (the plain
    way) leaves a window in which another process takes it, and rank 0 then fails with
    ``EADDRINUSE``: tests running side by side did.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


def resolve_device(device: str | None, rank: int) -> torch.device:
    """``cuda:<local rank>`` when CUDA is available (or asked for), else CPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device(device)


def init_process_group(rank: int, world_size: int, device: torch.device) -> bool:
    """Join (or create) the default process group; returns True when this call created it."""
    if dist.is_initialized():
        return False
    backend = "nccl" if device.type == "cuda" else "gloo"
    device_id = device if backend == "nccl" else None
    if "MASTER_PORT" not in os.environ:
        if world_size > 1:
            raise RuntimeError("MASTER_PORT must be set for a multi-rank trainer (every rank the same port)")
        # One rank needs no rendezvous: an in-process store binds no port, so two
        # trainers created one after the other never race for one.
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, device_id=device_id)
        return True
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(backend, rank=rank, world_size=world_size, device_id=device_id)
    return True


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_reduce_sum(
    values: Sequence[float], device: torch.device, group: dist.ProcessGroup | None = None
) -> list[float]:
    """Element-wise sum over the ranks of ``group`` (default: all), float64, in one collective."""
    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return [float(x) for x in tensor.cpu()]


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The unsharded value of a (possibly DTensor) tensor; collective for DTensors."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
