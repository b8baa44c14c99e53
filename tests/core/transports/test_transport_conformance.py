"""The built-in transports pass the weight-transport conformance kit (nccl over gloo on the CPU)."""

from __future__ import annotations

from telescope.api.context import TransportContext
from telescope.api.transport import WeightTransport
from telescope.testing.transport import WeightTransportConformance
from telescope.transports.memory import MemoryTransport
from telescope.transports.nccl import NCCLTransport


def make_memory() -> WeightTransport:
    return MemoryTransport(TransportContext(timeout_s=60))


def make_gloo_broadcast() -> WeightTransport:
    return NCCLTransport(TransportContext(timeout_s=60), backend="gloo")


class TestMemoryTransport(WeightTransportConformance):
    factory = staticmethod(make_memory)


class TestBroadcastTransportOverGloo(WeightTransportConformance):
    factory = staticmethod(make_gloo_broadcast)
