"""Registers the built-in trainer backend (``fsdp``) and the settings it owns."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from telescope.api.settings import PluginSettings
from telescope.hookspecs import hookimpl
from telescope.plugins.registry import Registrar


class FSDPSettings(PluginSettings):
    """The fields only the ``fsdp`` backend reads."""

    section = "model"

    mixed_precision_dtype: Literal["float32", "float16", "bfloat16"] | None = Field(
        "bfloat16", description="FSDP mixed precision compute dtype. null to disable"
    )
    gradient_checkpointing: bool = Field(True, description="FSDP activation recomputation (saves memory)")


@hookimpl
def telescope_register_trainer_backends(register: Registrar) -> None:
    register("fsdp", "telescope.trainer.fsdp:FSDPBackend", settings=FSDPSettings)
