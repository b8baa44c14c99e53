"""Registers the ``megatron`` trainer backend and the ``megatron_*`` settings it owns.

Only the settings the backend implements are declared (a field exists only where
code reads it). Pipeline, context and expert parallelism, sequence parallelism,
the distributed optimizer and its offloading/precision options, Transformer Engine
and FP8 are not built yet; their fields come back with the code that reads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from telescope.api.settings import PluginSettings, SettingsProblem
from telescope.hookspecs import hookimpl
from telescope.plugins.registry import Registrar

if TYPE_CHECKING:
    from telescope.config.schema import TelescopeConfig


class MegatronSettings(PluginSettings):
    """The fields only the ``megatron`` backend reads."""

    section = "megatron"

    megatron_tensor_parallel_size: int = Field(
        1, ge=1, description="Tensor parallelism degree (trainer_num_workers must be a multiple of it)"
    )
    megatron_gradient_checkpointing: bool = Field(True, description="Recompute activations in the backward pass")
    megatron_grad_reduce_in_fp32: bool = Field(
        True, description="All-reduce gradients over data-parallel ranks in float32 (for bf16/fp16 models)"
    )

    @classmethod
    def config_problems(cls, config: TelescopeConfig) -> list[str]:
        if config.train_backend != "megatron":
            return []
        tp = config.settings(cls).megatron_tensor_parallel_size
        if config.trainer_num_workers % tp:
            return [
                SettingsProblem(
                    f"trainer_num_workers ({config.trainer_num_workers}) must be a multiple of "
                    f"megatron_tensor_parallel_size ({tp})",
                    fields=("megatron_tensor_parallel_size", "trainer_num_workers"),
                )
            ]
        return []


@hookimpl
def telescope_register_trainer_backends(register: Registrar) -> None:
    register(
        "megatron",
        "telescope_megatron.backend:MegatronBackend",
        settings=MegatronSettings,
        install_hint="pip install telescope-megatron",
    )
