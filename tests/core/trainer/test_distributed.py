"""``reserve_port``: the process group's port is held, against other processes, until the store listens on it."""

from __future__ import annotations

import errno
import socket
from datetime import timedelta

import pytest
import torch.distributed as dist

from telescope.trainer.distributed import reserve_port


def test_a_reserved_port_refuses_any_other_bind() -> None:
    with reserve_port("127.0.0.1") as reservation:
        port = reservation.getsockname()[1]
        with socket.socket() as other, pytest.raises(OSError) as refused:
            other.bind(("127.0.0.1", port))
        assert refused.value.errno == errno.EADDRINUSE
    with socket.socket() as other:  # released: free again
        other.bind(("127.0.0.1", port))


def test_rank_zeros_store_listens_on_the_reserved_port() -> None:
    with reserve_port() as reservation:
        port = reservation.getsockname()[1]
        store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=10))
        store.set("key", "value")
        assert store.get("key") == b"value"
        client = dist.TCPStore("127.0.0.1", port, 1, is_master=False, timeout=timedelta(seconds=10))
        assert client.get("key") == b"value"
    del client, store
