"""The broadcast transport: its protocol over gloo on CPU (both modes), and NCCL on a GPU."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest
import torch

from telescope.transports.nccl import NCCLTransport


def _weights(version: int, device: str = "cpu") -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(version)
    return (
        [
            ("model.embed.weight", torch.randn(64, 16, generator=g)),
            ("model.norm.weight", torch.randn(16, generator=g).to(torch.bfloat16)),
            ("model.layer.bias", torch.randn(33, generator=g).double()),
            ("lm_head.weight", torch.randn(8, 16, generator=g)),
        ]
        if device == "cpu"
        else [(n, t.to(device)) for n, t in _weights(version)]
    )


def _receiver(init_info: dict[str, Any], rank: int, versions: list[int], out: Any, device: str) -> None:
    try:
        transport = NCCLTransport(None)
        transport.connect_receiver(init_info, rank, device)
        for version in versions:
            got = {name: t.cpu().clone() for name, t in transport.receive(version)}
            expected = dict(_weights(version))
            ok = got.keys() == expected.keys() and all(
                got[k].dtype == expected[k].dtype and torch.equal(got[k], expected[k]) for k in expected
            )
            out.put((rank, version, ok))
    except Exception as exc:  # reported to the test
        out.put((rank, -1, repr(exc)))


def _run(backend: str, device: str, cpu_staging: bool = False) -> None:
    sender = NCCLTransport(None, backend=backend)
    sender.bucket_bytes = 1024  # several buckets for these small tensors
    sender.cpu_staging = cpu_staging
    info = sender.prepare_sender(num_receivers=2)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    versions = [1, 2]
    procs = [
        ctx.Process(target=_receiver, args=(info, rank, versions, out, device.format(rank=rank))) for rank in (1, 2)
    ]
    for p in procs:
        p.start()
    try:
        sender.send(_weights(1, device.format(rank=0)), version=1)
        sender.mode = "per_tensor"
        sender.send(_weights(2, device.format(rank=0)), version=2)
        results = sorted(out.get(timeout=120) for _ in range(4))
        assert results == [(1, 1, True), (1, 2, True), (2, 1, True), (2, 2, True)], results
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        sender.close()


@pytest.mark.slow
def test_broadcast_protocol_over_gloo() -> None:
    _run("gloo", "cpu")


def test_receiver_rank_is_checked() -> None:
    transport = NCCLTransport(None)
    with pytest.raises(ValueError, match="outside"):
        transport.connect_receiver({"host": "127.0.0.1", "port": 1, "world_size": 2}, rank=2)
    with pytest.raises(ValueError, match="lacks"):
        transport.connect_receiver({"host": "127.0.0.1"}, rank=1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 1, reason="needs a CUDA GPU")
@pytest.mark.parametrize("cpu_staging", [False, True])
def test_broadcast_over_nccl(cpu_staging: bool) -> None:
    if torch.cuda.device_count() < 3:
        pytest.skip("needs 3 GPUs (one sender, two receivers)")
    _run("nccl", "cuda:{rank}", cpu_staging=cpu_staging)


def test_the_rendezvous_listens_on_its_address_only() -> None:
    """A ``TCPStore`` left to itself listens on every interface; the sender's listens where it is dialled."""
    import os

    import psutil

    sender = NCCLTransport(None, backend="gloo")  # a context by hand: one node, loopback
    info = sender.prepare_sender(num_receivers=1)
    try:
        connections = psutil.Process(os.getpid()).net_connections("inet")
        listening = [c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN and c.laddr.port == info["port"]]
        assert info["host"] == "127.0.0.1" and listening == ["127.0.0.1"]
    finally:
        sender.close()
