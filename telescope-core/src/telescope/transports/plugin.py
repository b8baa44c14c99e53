"""Registers the built-in weight transports (``memory``, ``nccl``) through the public hook."""

from __future__ import annotations

from telescope.hookspecs import hookimpl
from telescope.plugins.registry import Registrar


@hookimpl
def telescope_register_weight_transports(register: Registrar) -> None:
    register("memory", "telescope.transports.memory:MemoryTransport")
    register("nccl", "telescope.transports.nccl:NCCLTransport")
