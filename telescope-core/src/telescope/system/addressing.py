"""Network addresses on a cluster: what others dial to reach a process, and what it binds.

No code path assumes 127.0.0.1 or the driver's host. The rules:

- A server binds only where its clients are (``inference_host: auto``, the default,
  :func:`server_bind_host`): loopback on the orchestrator's node (its one HTTP
  client), the node's address as Ray reports it on another node; outside Ray
  (``telescope eval``, tests) loopback. Never every interface unless the config says
  ``inference_host: 0.0.0.0``.
- A server bound to a wildcard is reached at its node's address:
  :func:`advertised_host` returns ``TELESCOPE_NODE_IP``, which the Ray worker that
  starts it sets to the node address Ray reports (``ray.util.get_node_ip_address()``
  inside the actor); outside Ray it is loopback. A server bound to one address is
  reached there.
- A rendezvous (the trainer's process group, the weight transport's store) is
  hosted by the rank that owns it, at its node's address; a peer binds the
  interface it reaches that address through (:func:`local_address_towards`):
  gloo's default device is the address the hostname resolves to, which is
  loopback on many machines (``127.0.0.1 <hostname>`` in ``/etc/hosts``) and so
  unreachable from another node.
- Loopback is used only where every party is known to share the node
  (``ray_broadcast_prefer_loopback_if_single_node`` with a single-node placement).

Pure functions of the standard library (and psutil for interface names); nothing
here imports Ray.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any
from urllib.parse import urlsplit

#: Set by the Ray worker that starts a server: the address of its node.
NODE_IP_ENV = "TELESCOPE_NODE_IP"
LOOPBACK = "127.0.0.1"


def is_wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::", "[::]")


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port`` 0: one the system picks), not yet listening.

    With ``SO_REUSEADDR``, as servers bind: a port whose last connections are in
    TIME_WAIT is free. Raises ``OSError`` when the port is taken.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def server_bind_host(node: str, orchestrator_node: str) -> str:
    """Where a server on ``node`` binds (``inference_host: auto``): loopback on the orchestrator's node, else
    the node's own address (the one its clients on other nodes dial; never a wildcard)."""
    return LOOPBACK if node == orchestrator_node else node


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def node_ip() -> str | None:
    """This node's address as the scheduler reported it (``TELESCOPE_NODE_IP``), else None."""
    return os.environ.get(NODE_IP_ENV) or None


def advertised_host(bind_host: str) -> str:
    """The address a client dials for a server bound to ``bind_host`` on this node."""
    if is_wildcard(bind_host):
        return node_ip() or LOOPBACK
    return bind_host


def local_address_towards(host: str) -> str:
    """The address of this machine's interface that routes to ``host`` (loopback for a loopback host).

    A UDP ``connect`` sends nothing; it only asks the kernel for the route.
    """
    if is_loopback(host):
        return LOOPBACK
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host.strip("[]"), 9))
            return str(probe.getsockname()[0])
        except OSError:
            return node_ip() or LOOPBACK


def interface_of(address: str) -> str | None:
    """The name of the network interface that holds ``address`` (e.g. ``eth0``), or None."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addresses):
            return name
    return None


def rendezvous_host(prefer_loopback: bool, single_node: bool, owner_host: str | None) -> str:
    """Where a rendezvous its owner hosts is dialled: loopback only when every party shares the node.

    ``owner_host`` is the owner's node address (None: unknown, then this machine's
    outward address); ``TELESCOPE_WEIGHT_BROADCAST_HOST`` overrides both.
    """
    override = os.environ.get("TELESCOPE_WEIGHT_BROADCAST_HOST")
    if override:
        return override
    if prefer_loopback and single_node:
        return LOOPBACK
    return owner_host or node_ip() or local_address_towards("10.255.255.255")


def single_node(sender: dict[str, Any], receivers: list[dict[str, Any]]) -> bool:
    """Whether trainer rank 0 and every server were placed on one node (their ``placement()`` records)."""
    return all(r["node"] == sender["node"] for r in receivers)


def unreachable_server(placements: list[dict[str, Any]], here: str, inference_host: str) -> str | None:
    """Why the orchestrator on node ``here`` cannot reach a server (None: it can reach every one).

    A server on another node must not advertise a loopback URL.
    """
    for index, placed in enumerate(placements):
        host = urlsplit(placed["url"]).hostname or ""
        if is_loopback(host) and placed["node"] != here:
            return (
                f"inference server {index} runs on node {placed['node']} but listens on {placed['url']} "
                f"(inference_host={inference_host!r}), which the orchestrator on {here} cannot "
                "reach; set inference_host: auto (the default) or that node's address"
            )
    return None


def memory_transport_error(sender: dict[str, Any], receivers: list[dict[str, Any]]) -> str:
    """Why ``weight_transport: memory`` cannot serve a placement that is not :func:`single_node`."""
    nodes = sorted({p["node"] for p in receivers} - {sender["node"]})
    return (
        f"weight_transport: memory works on one machine, but inference servers run on {', '.join(nodes)} "
        f"and trainer rank 0 on {sender['node']}; use weight_transport: nccl (gloo on CPUs) or auto"
    )
