"""Registers the ``megatron`` trainer backend and the ``megatron_*`` settings it owns.

All 21 ``megatron_*`` fields of the upstream are declared, so that an upstream
config validates unchanged. Fourteen are implemented: tensor, pipeline, context,
expert (MoE models) and sequence parallelism, activation recomputation, the float32
gradient reduction, the gradient reduction overlapped with the backward (bucketed
all-reduces launched as the last micro-batch's backward completes each bucket:
:mod:`telescope_megatron.grad_buckets`), the distributed optimizer (AdamW states
sharded over the data-parallel ranks, :mod:`telescope_megatron.optimizer`; with
expert parallelism it is not applied yet, see :func:`inactive_settings`), and the
precision-aware optimizer with its four dtypes (main parameters, main gradients,
Adam's two moments: :mod:`telescope_megatron.precision`; the core's
``mixed_precision_dtype`` sets the compute dtype). As megatron-core's
``OptimizerConfig`` asserts, the four dtypes are float32 unless
``megatron_use_precision_aware_optimizer`` is set; with it each may be float32,
bfloat16 or float16 (:func:`precision_problems`). Of the others (not built yet):

each (a global batch size of its own, optimizer offload and its options, the
unified-memory JIT, Transformer Engine, FP8) is accepted at the value this backend
implements (the upstream default) and any other value is a validation error naming
the field (:data:`REFUSED_UNLESS`, with the reason where :data:`REFUSED_BECAUSE`
gives one).

Load-time rules: ``trainer_num_workers`` must be a multiple of TP x PP x CP (the
dense layout) and of TP x PP x EP (megatron-core's expert layout: expert TP = TP, EP,
expert data parallel, PP). That EP divides the model's ``num_experts`` is checked
when the backend is set up (the model is not read at load time).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import Field

from telescope.api.settings import PluginSettings, SettingsProblem
from telescope.plugins.hookspecs import hookimpl
from telescope.plugins.registry import Registrar

if TYPE_CHECKING:
    from telescope.schema.config import TelescopeConfig


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

    # -- upstream fields not built yet (see the module docstring)
    megatron_pipeline_parallel_size: int = Field(
        1, ge=1, description="Pipeline parallelism degree (trainer_num_workers must be a multiple of TP x PP)"
    )
    megatron_context_parallel_size: int = Field(
        1, ge=1, description="Context parallelism degree: each sequence split over CP ranks, load-balanced"
    )
    megatron_expert_parallel_size: int = Field(
        1,
        ge=1,
        description="Expert parallelism degree, MoE models: each rank holds num_experts / EP experts "
        "(trainer_num_workers must be a multiple of TP x PP x EP)",
    )
    megatron_global_batch_size: int | None = Field(
        None, ge=1, description="Global batch size; null = prompts_batch_size_for_trainer (null only, for now)"
    )
    megatron_disable_unified_memory_jit: bool = Field(True, description="Disable unified memory JIT (true only)")
    megatron_optimizer_cpu_offload: bool = Field(False, description="Offload optimizer states to CPU (false only)")
    megatron_optimizer_offload_fraction: float = Field(
        1.0, ge=0, le=1, description="Fraction of optimizer state to offload (with megatron_optimizer_cpu_offload)"
    )
    megatron_overlap_cpu_optimizer_d2h_h2d: bool = Field(
        True, description="Overlap CPU optimizer D2H/H2D transfers (with offload, not built: true only)"
    )
    megatron_use_precision_aware_optimizer: bool = Field(
        False,
        description="Let the four megatron_*_dtype fields below be other than float32 (as megatron-core: "
        "without it the main parameters, main gradients and Adam's moments are float32)",
    )
    megatron_main_grads_dtype: str = Field(
        "float32",
        description="Data type of the main gradients (clipping and the optimizer read them): float32, bfloat16 "
        "or float16 (not float32: with megatron_use_precision_aware_optimizer)",
    )
    megatron_main_params_dtype: str = Field(
        "float32",
        description="Data type of the main parameters (the master weights the optimizer steps; the model's "
        "are in the compute dtype): float32, bfloat16 or float16 (not float32: with "
        "megatron_use_precision_aware_optimizer)",
    )
    megatron_exp_avg_dtype: str = Field(
        "float32",
        description="Data type of Adam's first moment: float32, bfloat16 or float16 (not float32: with "
        "megatron_use_precision_aware_optimizer)",
    )
    megatron_exp_avg_sq_dtype: str = Field(
        "float32",
        description="Data type of Adam's second moment: float32, bfloat16 or float16 (not float32: with "
        "megatron_use_precision_aware_optimizer)",
    )
    megatron_sequence_parallel: bool = Field(
        True, description="Split each sequence over the tensor-parallel ranks outside attention/MLP (TP > 1)"
    )
    megatron_use_distributed_optimizer: bool = Field(
        True, description="Shard AdamW's states across data-parallel ranks (ZeRO-1; DP x CP > 1 to help)"
    )
    megatron_overlap_grad_reduce: bool = Field(
        False,
        description="Launch each gradient bucket's data-parallel all-reduce during the backward, once its "
        "parameters' gradients are complete (the last micro-batch's, or under pipeline parallelism the schedule's)",
    )
    megatron_use_transformer_engine: bool = Field(
        False, description="Use the Transformer Engine layer spec (false only, for now)"
    )
    megatron_fp8: bool = Field(False, description="FP8 compute, needs Transformer Engine (false only, for now)")

    @classmethod
    def config_problems(cls, config: TelescopeConfig) -> list[str]:
        if config.train_backend != "megatron":
            return []
        settings = config.settings(cls)
        problems: list[str] = []
        tp, pp = settings.megatron_tensor_parallel_size, settings.megatron_pipeline_parallel_size
        # the dense layout (TP x CP x DP x PP) and megatron-core's expert layout (TP x EP x expert DP x PP)
        for third in ("megatron_context_parallel_size", "megatron_expert_parallel_size"):
            sizes = {
                "megatron_tensor_parallel_size": tp,
                "megatron_pipeline_parallel_size": pp,
                third: getattr(settings, third),
            }
            if config.trainer_num_workers % math.prod(sizes.values()) == 0 or (problems and sizes[third] == 1):
                continue  # EP 1: the expert layout asks nothing the dense one has not (reported once)
            named = [name for name, size in sizes.items() if size > 1 or name == "megatron_tensor_parallel_size"]
            problems.append(
                SettingsProblem(
                    f"trainer_num_workers ({config.trainer_num_workers}) must be a multiple of "
                    + " x ".join(f"{name} ({sizes[name]})" for name in named),
                    fields=(*named, "trainer_num_workers"),
                )
            )
        problems += [SettingsProblem(message, fields=(name,)) for name, message in _precision_problems(settings)]
        for name, supported in REFUSED_UNLESS.items():
            value = getattr(settings, name)
            if value != supported:
                why = f" ({REFUSED_BECAUSE[name]})" if name in REFUSED_BECAUSE else ""
                problems.append(
                    SettingsProblem(
                        f"{name}={value!r}: telescope-megatron does not build this yet{why}; "
                        f"set it to {supported!r} (or leave it out)",
                        fields=(name,),
                    )
                )
        return problems


#: Fields that would change what is computed, with the only value built so far.
REFUSED_UNLESS: dict[str, object] = {
    "megatron_global_batch_size": None,
    "megatron_optimizer_cpu_offload": False,
    "megatron_optimizer_offload_fraction": 1.0,  # offload is not built: its options keep their defaults
    "megatron_overlap_cpu_optimizer_d2h_h2d": True,
    "megatron_disable_unified_memory_jit": True,  # the backend never enables the unified-memory JIT
    "megatron_use_transformer_engine": False,
    "megatron_fp8": False,
}

#: Why a field of :data:`REFUSED_UNLESS` cannot take another value, where the name does not say it.
REFUSED_BECAUSE: dict[str, str] = {}


#: The precision-aware optimizer's dtype fields, and the dtypes each may name.
PRECISION_DTYPE_FIELDS = (
    "megatron_main_params_dtype",
    "megatron_main_grads_dtype",
    "megatron_exp_avg_dtype",
    "megatron_exp_avg_sq_dtype",
)
PRECISION_DTYPES = ("float32", "bfloat16", "float16")


def _precision_problems(settings: MegatronSettings) -> list[tuple[str, str]]:
    problems = []
    aware = settings.megatron_use_precision_aware_optimizer
    for name in PRECISION_DTYPE_FIELDS:
        value = getattr(settings, name)
        if value not in PRECISION_DTYPES:
            message = (
                f"{name}={value!r}: telescope-megatron builds {', '.join(PRECISION_DTYPES)} only "
                "(no 8-bit states or parameters)"
            )
        elif value != "float32" and not aware:
            message = (
                f"{name}={value!r} needs megatron_use_precision_aware_optimizer: true (as megatron-core: "
                "without it the optimizer's main parameters, main gradients and moments are float32)"
            )
        else:
            continue
        problems.append((name, message))
    return problems


def precision_problems(settings: MegatronSettings) -> list[str]:
    """What is wrong with the precision-aware optimizer's dtype fields (empty: nothing)."""
    return [message for _, message in _precision_problems(settings)]


def inactive_settings(settings: MegatronSettings, data_parallel_size: int, expert_parallel_size: int = 1) -> list[str]:
    """The options that are on where they would matter, and have no effect yet.

    The distributed optimizer is not applied with expert parallelism: its ZeRO shards
    broadcast each updated tensor over the data-parallel group, whose ranks hold
    *different* experts under EP (an expert's replicas form the smaller
    expert-data-parallel group), so AdamW stays unsharded there.
    """
    inactive = []
    if settings.megatron_use_distributed_optimizer and data_parallel_size > 1 and expert_parallel_size > 1:
        inactive.append("megatron_use_distributed_optimizer (with megatron_expert_parallel_size > 1)")
    return inactive


@hookimpl
def telescope_register_trainer_backends(register: Registrar) -> None:
    register(
        "megatron",
        "telescope_megatron.backend:MegatronBackend",
        settings=MegatronSettings,
        install_hint="pip install telescope-megatron",
    )
