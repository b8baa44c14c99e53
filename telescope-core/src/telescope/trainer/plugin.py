"""Registers the built-in trainer backend (``fsdp``) and the settings it owns."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from telescope.api.settings import PluginSettings, SettingsProblem

if TYPE_CHECKING:
    from telescope.config.schema import TelescopeConfig
from telescope.hookspecs import hookimpl
from telescope.plugins.registry import Registrar


class FSDPSettings(PluginSettings):
    """The fields only the ``fsdp`` backend reads."""

    section = "model"

    mixed_precision_dtype: Literal["float32", "float16", "bfloat16"] | None = Field(
        "bfloat16", description="FSDP mixed precision compute dtype. null to disable"
    )
    gradient_checkpointing: bool = Field(True, description="FSDP activation recomputation (saves memory)")
    fsdp_context_parallel_size: int = Field(
        1,
        ge=1,
        description="Context parallelism (ring attention) ranks per sequence with FSDP. Only 1 (off) is "
        "supported yet; long sequences need megatron_context_parallel_size",
    )

    @classmethod
    def config_problems(cls, config: TelescopeConfig) -> list[str]:
        size = config.settings(cls).fsdp_context_parallel_size
        if size > 1:
            return [
                SettingsProblem(
                    f"fsdp_context_parallel_size ({size}): the fsdp backend has no context parallelism yet; "
                    "use 1 (each rank holds whole sequences)",
                    fields=("fsdp_context_parallel_size",),
                )
            ]
        return []


@hookimpl
def telescope_register_trainer_backends(register: Registrar) -> None:
    register("fsdp", "telescope.trainer.fsdp:FSDPBackend", settings=FSDPSettings)
