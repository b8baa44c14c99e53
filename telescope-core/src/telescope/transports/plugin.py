"""Registers the built-in weight transports (``memory``, ``nccl``) and the settings NCCL owns."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from telescope.api.settings import PluginSettings
from telescope.plugins.hookspecs import hookimpl
from telescope.plugins.registry import Registrar


class NCCLSettings(PluginSettings):
    """How the ``nccl`` transport packs and stages the weights it broadcasts."""

    section = "weight broadcasting"

    weight_broadcast_mode: Literal["flattened_bucket", "per_tensor"] = Field(
        "flattened_bucket", description="Broadcast weights in flattened buckets or tensor by tensor"
    )
    weight_broadcast_bucket_mb: int = Field(256, ge=1, description="Bucket size in MB for flattened broadcast")
    weight_broadcast_cpu_staging: bool = Field(False, description="Use a CPU staging buffer for weight transfers")
    weight_broadcast_pin_memory: bool = Field(True, description="Use pinned CPU memory for faster H2D transfers")


@hookimpl
def telescope_register_weight_transports(register: Registrar) -> None:
    register("memory", "telescope.transports.memory:MemoryTransport")
    register("nccl", "telescope.transports.nccl:NCCLTransport", settings=NCCLSettings)
