"""Addresses on a cluster: what clients dial, where a rendezvous is, which port a server takes."""

from __future__ import annotations

import socket

import pytest

from telescope.api.context import InferenceContext, TransportContext
from telescope.runtime.ray_cluster import worker_bundle
from telescope.schema.config import TelescopeConfig
from telescope.system.addressing import (
    NODE_IP_ENV,
    advertised_host,
    interface_of,
    is_loopback,
    local_address_towards,
    rendezvous_host,
    server_bind_host,
    single_node,
)
from telescope.system.processes import choose_port, connect_host
from telescope.transports import default_transport_name
from telescope.transports.nccl import NCCLTransport


def test_a_wildcard_bound_server_is_reached_at_its_nodes_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NODE_IP_ENV, raising=False)
    assert connect_host("0.0.0.0") == "127.0.0.1"  # no scheduler said where we are: this machine
    monkeypatch.setenv(NODE_IP_ENV, "10.77.0.2")  # what the Ray worker sets from ray.util.get_node_ip_address()
    assert connect_host("0.0.0.0") == advertised_host("::") == "10.77.0.2"
    assert connect_host("127.0.0.1") == "127.0.0.1"  # bound to one address: that one
    assert connect_host("10.0.0.5") == "10.0.0.5"


def test_servers_bind_only_where_the_orchestrator_reaches_them_never_every_interface() -> None:
    """``inference_host: auto`` (the default): loopback beside the orchestrator, the node's address elsewhere."""
    assert TelescopeConfig.model_validate({"environments": [{"name": "countdown"}]}).inference_host == "auto"
    assert server_bind_host("10.0.0.1", orchestrator_node="10.0.0.1") == "127.0.0.1"  # one node
    assert server_bind_host("10.0.0.2", orchestrator_node="10.0.0.1") == "10.0.0.2"  # another node
    config = TelescopeConfig.model_validate({"environments": [{"name": "countdown"}]})
    assert InferenceContext.from_config(config).host == "127.0.0.1"  # no scheduler: telescope eval, tests
    explicit = config.model_copy(update={"inference_host": "0.0.0.0"})
    assert InferenceContext.from_config(explicit).host == "0.0.0.0"  # asked for: kept


def test_loopback_detection() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1") and is_loopback("127.0.1.1")
    assert not is_loopback("10.77.0.1") and not is_loopback("0.0.0.0") and not is_loopback("node-b")


def test_the_local_address_towards_a_host_is_an_address_of_this_machine() -> None:
    assert local_address_towards("127.0.0.1") == "127.0.0.1"
    outward = local_address_towards("10.255.255.255")
    assert interface_of(outward) is not None or outward == "127.0.0.1"
    assert interface_of("127.0.0.1") is not None  # lo
    assert interface_of("203.0.113.254") is None


def test_the_rendezvous_is_loopback_only_when_every_party_shares_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TELESCOPE_WEIGHT_BROADCAST_HOST", raising=False)
    assert rendezvous_host(True, True, "10.77.0.1") == "127.0.0.1"
    assert rendezvous_host(True, False, "10.77.0.1") == "10.77.0.1"  # a server on another node
    assert rendezvous_host(False, True, "10.77.0.1") == "10.77.0.1"  # loopback not preferred
    monkeypatch.setenv("TELESCOPE_WEIGHT_BROADCAST_HOST", "192.0.2.9")
    assert rendezvous_host(True, False, "10.77.0.1") == "192.0.2.9"


def test_the_broadcast_transport_takes_single_node_and_the_host_from_the_placement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, ``single_node`` was hard-coded True: the rendezvous was 127.0.0.1 on every cluster."""
    monkeypatch.delenv("TELESCOPE_WEIGHT_BROADCAST_HOST", raising=False)
    placed = TransportContext(timeout_s=5, sender_host="127.0.0.1", single_node=False)
    sender = NCCLTransport(placed, backend="gloo")
    try:
        info = sender.prepare_sender(1)
        assert info["host"] == "127.0.0.1" and sender.single_node is False  # the sender's node, as the run said
    finally:
        sender.close()
    assert NCCLTransport(TransportContext(single_node=True), backend="gloo").single_node is True


def test_single_node_and_the_auto_transport_follow_the_placement() -> None:
    rank0 = {"node": "10.77.0.1"}
    assert single_node(rank0, [{"node": "10.77.0.1"}, {"node": "10.77.0.1"}])
    assert not single_node(rank0, [{"node": "10.77.0.1"}, {"node": "10.77.0.2"}])
    assert default_transport_name(gpu=False) == "memory"
    assert default_transport_name(gpu=False, multi_node=True) == "nccl"  # over gloo: memory needs one machine
    assert default_transport_name(gpu=True) == "nccl"


def test_a_worker_bundle_carries_its_custom_resources() -> None:
    assert worker_bundle(1.0, 0.0) == {"CPU": 1.0}
    assert worker_bundle(2.0, 2.0, {"node_b": 1}) == {"CPU": 2.0, "GPU": 2.0, "node_b": 1.0}


def test_a_taken_port_is_replaced_by_a_free_one(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        taken = int(holder.getsockname()[1])
        chosen = choose_port("0.0.0.0", taken)
        assert chosen != taken and chosen > 0
        assert "is taken" in caplog.text
        assert choose_port("127.0.0.1", taken) != taken
    assert choose_port("0.0.0.0", chosen) == chosen  # free: kept
