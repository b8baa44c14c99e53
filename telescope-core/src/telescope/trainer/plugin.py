"""Registers the built-in trainer backend (``fsdp``) and the settings it owns."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from telescope.api.settings import PluginSettings, SettingsProblem

if TYPE_CHECKING:
    from telescope.schema.config import TelescopeConfig
from telescope.plugins.hookspecs import hookimpl
from telescope.plugins.registry import Registrar


class FSDPSettings(PluginSettings):
    """The fields only the ``fsdp`` backend reads."""

    section = "model"

    gradient_checkpointing: bool = Field(True, description="FSDP activation recomputation (saves memory)")
    fsdp_context_parallel_size: int = Field(
        1,
        ge=1,
        description="Context parallelism with FSDP: ranks that share each packed sequence (each runs 2 of its "
        "2 x size load-balanced chunks; attention all-gathers keys and values). 1 = off. trainer_num_workers "
        "must be a multiple; data-parallel size = trainer_num_workers / size",
    )
    share_prompt_prefixes: bool = Field(
        True,
        description="Pack each group's common prompt once per packed row instead of once per sample (same "
        "logits and gradients, fewer tokens). Applies where the trainer runs its own packed attention (no "
        "flash-attn varlen kernel, no context parallelism)",
    )
    trainer_prewarm: bool = Field(
        True,
        description="At set-up, one forward and backward on a synthetic packed row of seq_len tokens (no update; "
        "the run trains the same), so the first training step does not pay for first-touch memory and kernel "
        "set-up",
    )

    @classmethod
    def config_problems(cls, config: TelescopeConfig) -> list[str]:
        size = config.settings(cls).fsdp_context_parallel_size
        if config.train_backend == "fsdp" and config.trainer_num_workers % size:
            return [
                SettingsProblem(
                    f"trainer_num_workers ({config.trainer_num_workers}) must be a multiple of "
                    f"fsdp_context_parallel_size ({size})",
                    fields=("fsdp_context_parallel_size", "trainer_num_workers"),
                )
            ]
        return []


@hookimpl
def telescope_register_trainer_backends(register: Registrar) -> None:
    register("fsdp", "telescope.trainer.fsdp:FSDPBackend", settings=FSDPSettings)
