"""The megatron_* settings: owned by telescope-megatron, validated at load time, reaching the backend."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from telescope.config.composition import composed_schema
from telescope.testing.trainer import tiny_trainer_config


def test_the_package_registers_the_backend_and_its_fields() -> None:
    from telescope_megatron.backend import MegatronBackend

    from telescope.plugins.facade import get_plugins

    assert get_plugins().trainer_backend("megatron") is MegatronBackend
    fields = composed_schema().model.model_fields
    assert {"megatron_tensor_parallel_size", "megatron_gradient_checkpointing", "megatron_grad_reduce_in_fp32"} <= set(
        fields
    )


def test_settings_reach_the_backend(tiny_model: Path) -> None:
    from telescope.plugins.facade import get_plugins

    config = tiny_trainer_config(
        tiny_model,
        train_backend="megatron",
        megatron_tensor_parallel_size=2,
        trainer_num_workers=4,
        megatron_grad_reduce_in_fp32=False,
    )
    plugins = get_plugins()
    backend = plugins.create_trainer_backend(config, plugins.create_algorithm(config))
    assert backend.megatron.megatron_tensor_parallel_size == 2  # type: ignore[attr-defined]
    assert backend.megatron.megatron_grad_reduce_in_fp32 is False  # type: ignore[attr-defined]


def test_workers_must_be_a_multiple_of_the_model_parallel_size(tiny_model: Path) -> None:
    def problems(**overrides: object) -> list[str]:
        values = {"megatron_tensor_parallel_size": 2, "trainer_num_workers": 3, **overrides}
        return [
            message for message, _ in composed_schema().settings_problems(tiny_trainer_config(tiny_model, **values))
        ]

    assert problems(train_backend="megatron") == [
        "trainer_num_workers (3) must be a multiple of megatron_tensor_parallel_size (2)"
    ]
    assert problems(train_backend="fsdp") == []  # the rule is the megatron backend's
    assert problems(train_backend="megatron", megatron_pipeline_parallel_size=2, trainer_num_workers=6) == [
        "trainer_num_workers (6) must be a multiple of megatron_tensor_parallel_size (2) "
        "x megatron_pipeline_parallel_size (2)"
    ]
    assert problems(train_backend="megatron", megatron_pipeline_parallel_size=2, trainer_num_workers=4) == []


def test_a_world_size_that_tensor_parallelism_does_not_divide_is_refused(tiny_model: Path) -> None:
    from telescope_megatron.backend import MegatronBackend
    from telescope_megatron.plugin import MegatronSettings

    from telescope.api.context import TrainerContext

    settings = MegatronSettings(megatron_tensor_parallel_size=3)
    backend = MegatronBackend(TrainerContext(model=str(tiny_model)), None, settings)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"world size 1 is not a multiple of megatron_tensor_parallel_size \(3\)"):
        backend.setup(0, 1, "cpu")


@pytest.mark.parametrize(
    ("family", "expert_parallel", "message"),
    [
        ("qwen3_moe", 3, r"num_experts \(4\) not divisible by megatron_expert_parallel_size \(3\)"),
        ("qwen3", 2, r"megatron_expert_parallel_size \(2\) needs an MoE model"),
    ],
)
def test_an_expert_parallel_size_the_model_cannot_take_is_refused(
    tmp_path_factory: pytest.TempPathFactory, family: str, expert_parallel: int, message: str
) -> None:
    """Refused when the backend is set up, before any process group: the model's experts must split evenly."""
    from telescope_megatron.backend import MegatronBackend
    from telescope_megatron.plugin import MegatronSettings
    from tests.megatron.conftest import build_family_model

    from telescope.api.context import TrainerContext

    model = build_family_model(tmp_path_factory.getbasetemp() / f"megatron-{family}", family)
    settings = MegatronSettings(megatron_expert_parallel_size=expert_parallel)
    backend = MegatronBackend(TrainerContext(model=str(model)), None, settings)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        backend.setup(0, expert_parallel, "cpu")


def test_upstream_fields_not_built_yet_accept_only_what_the_backend_does(tiny_model: Path) -> None:
    def problems(**overrides: object) -> list[str]:
        config = tiny_trainer_config(tiny_model, **{"train_backend": "megatron", **overrides})
        return [message for message, _ in composed_schema().settings_problems(config)]

    assert problems() == []  # the upstream defaults validate
    assert problems(megatron_expert_parallel_size=2, trainer_num_workers=3) == [  # built: megatron-core's layout
        "trainer_num_workers (3) must be a multiple of megatron_tensor_parallel_size (1) x "
        "megatron_expert_parallel_size (2)"
    ]
    assert problems(megatron_expert_parallel_size=2, megatron_tensor_parallel_size=2, trainer_num_workers=6) == [
        "trainer_num_workers (6) must be a multiple of megatron_tensor_parallel_size (2) x "
        "megatron_expert_parallel_size (2)"
    ]
    assert problems(megatron_expert_parallel_size=2, trainer_num_workers=2) == []
    assert problems(megatron_context_parallel_size=2, trainer_num_workers=3) == [  # built: the workers must fit
        "trainer_num_workers (3) must be a multiple of megatron_tensor_parallel_size (1) x "
        "megatron_context_parallel_size (2)"
    ]
    assert problems(megatron_context_parallel_size=2, trainer_num_workers=2) == []
    assert problems(megatron_fp8=True, megatron_optimizer_cpu_offload=True) == [
        "megatron_optimizer_cpu_offload=True: telescope-megatron does not build this yet; "
        "set it to False (or leave it out)",
        "megatron_fp8=True: telescope-megatron does not build this yet; set it to False (or leave it out)",
    ]
    assert problems(train_backend="fsdp", megatron_expert_parallel_size=2) == []  # ignored by FSDP


def test_the_precision_dtypes_need_the_precision_aware_optimizer_as_in_megatron_core(tiny_model: Path) -> None:
    from telescope_megatron.plugin import MegatronSettings
    from telescope_megatron.precision import Precision

    from telescope.api.context import TrainerContext

    def problems(**overrides: object) -> list[str]:
        config = tiny_trainer_config(tiny_model, **{"train_backend": "megatron", **overrides})
        return [message for message, _ in composed_schema().settings_problems(config)]

    assert problems(megatron_main_grads_dtype="bfloat16") == [
        "megatron_main_grads_dtype='bfloat16' needs megatron_use_precision_aware_optimizer: true (as megatron-core: "
        "without it the optimizer's main parameters, main gradients and moments are float32)"
    ]
    aware = {"megatron_use_precision_aware_optimizer": True}
    assert problems(**aware) == []
    lower = {
        "megatron_main_params_dtype": "float16",
        "megatron_main_grads_dtype": "bfloat16",
        "megatron_exp_avg_dtype": "bfloat16",
        "megatron_exp_avg_sq_dtype": "float16",
    }
    assert problems(**aware, **lower) == []
    assert problems(**aware, megatron_exp_avg_dtype="uint8") == [
        "megatron_exp_avg_dtype='uint8': telescope-megatron builds float32, bfloat16, float16 only "
        "(no 8-bit states or parameters)"
    ]
    assert problems(train_backend="fsdp", megatron_main_grads_dtype="uint8") == []  # ignored by FSDP

    # a backend built by hand refuses them too, and otherwise reads every field
    with pytest.raises(ValueError, match="megatron_main_params_dtype='bfloat16' needs"):
        Precision.of(TrainerContext(model="m"), MegatronSettings(megatron_main_params_dtype="bfloat16"))
    context = TrainerContext(model="m", model_dtype="float32", mixed_precision_dtype="bfloat16")
    precision = Precision.of(context, MegatronSettings(**aware, **lower, megatron_grad_reduce_in_fp32=False))
    assert precision == Precision(
        compute=torch.bfloat16,
        main_params=torch.float16,
        main_grads=torch.bfloat16,
        grad_buffer=torch.bfloat16,  # without megatron_grad_reduce_in_fp32: the compute dtype
        exp_avg=torch.bfloat16,
        exp_avg_sq=torch.float16,
    )
    assert Precision.of(TrainerContext(model="m", model_dtype="bfloat16"), MegatronSettings()) == Precision(
        compute=torch.bfloat16  # no mixed_precision_dtype: the model_dtype; the rest float32
    )


def test_gradient_reduce_overlap_is_accepted_and_fp8_still_refused(tiny_model: Path) -> None:
    def problems(**overrides: object) -> list[str]:
        config = tiny_trainer_config(tiny_model, **{"train_backend": "megatron", **overrides})
        return [message for message, _ in composed_schema().settings_problems(config)]

    assert problems(megatron_overlap_grad_reduce=True) == []  # built: telescope_megatron.grad_buckets
    [problem] = problems(megatron_overlap_grad_reduce=True, megatron_fp8=True)
    assert problem.startswith("megatron_fp8=True: telescope-megatron does not build this yet")
    assert "set it to False" in problem


def test_settings_without_effect_yet_are_named() -> None:
    from telescope_megatron.plugin import MegatronSettings, inactive_settings

    assert inactive_settings(MegatronSettings(), data_parallel_size=2) == []  # the distributed optimizer is built
    # ... but not applied with expert parallelism (its ZeRO broadcast would mix different experts)
    assert inactive_settings(MegatronSettings(), data_parallel_size=2, expert_parallel_size=2) == [
        "megatron_use_distributed_optimizer (with megatron_expert_parallel_size > 1)"
    ]
