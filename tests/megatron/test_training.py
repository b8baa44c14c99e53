"""Training through the Algorithm interface: one step of the megatron backend equals one of the FSDP backend.

Same config, same HF weights, same batch: the loss, the gradient norm and every
weight after the optimizer step agree within float32 rounding, at TP 1 (in this
process) and at TP 2 (two gloo ranks, slow). Each packed sequence holds one sample
here: on the CPU the FSDP backend's ``sdpa`` forward of a packed row lets a sample
attend to the samples packed before it, which the megatron backend's mask does not
(see the package README).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from telescope.api.trainer import TrainerBackend
from telescope.testing.trainer import spawn_ranks, synthetic_batch, tiny_trainer_config, weights_snapshot

#: One sample per packed sequence (samples are 17..21 tokens, sequences 24).
SETTINGS: dict[str, Any] = {"seq_len": 24, "max_model_len": 24, "max_tokens": 16, "pad_to_multiple_of": 8}
LENGTHS = (12, 16)


def make_backend(model: str, backend: str, **overrides: Any) -> TrainerBackend:
    from telescope.plugins.facade import get_plugins

    config = tiny_trainer_config(model, train_backend=backend, **{**SETTINGS, **overrides})
    plugins = get_plugins()
    return plugins.create_trainer_backend(config, plugins.create_algorithm(config))


def one_step(model: str, backend_name: str, rank: int = 0, world_size: int = 1, **overrides: Any) -> dict[str, Any]:
    backend = make_backend(model, backend_name, **overrides)
    backend.setup(rank, world_size, "cpu")
    before = weights_snapshot(backend)
    metrics = backend.train_step(synthetic_batch(completion_lengths=LENGTHS, num_groups=2))
    after = weights_snapshot(backend)
    backend.close()
    return {"metrics": metrics, "before": before, "after": after}


def assert_same_step(got: dict[str, Any], want: dict[str, Any]) -> None:
    for key in ("loss", "grad_norm", "entropy", "train/loss_tokens"):
        assert got["metrics"][key] == pytest.approx(want["metrics"][key], rel=1e-5, abs=1e-6), key
    assert list(got["after"]) == list(want["after"]), "Hugging Face names or order differ"
    # Adam's first step moves each weight by about lr * g / (|g| + eps) (lr = 1e-3 here): float32
    # rounding of a gradient element near eps changes its update by up to a few 1e-6, so the
    # weights are compared to 1% of the learning rate (measured: at most 3.5e-6, one element).
    for name, tensor in want["after"].items():
        torch.testing.assert_close(got["after"][name], tensor, atol=1e-5, rtol=0, msg=name)
    moved = max(float((want["after"][k] - want["before"][k]).abs().max()) for k in want["after"])
    assert moved > 1e-4, "the step did not move the weights: the comparison would prove nothing"


def test_one_step_equals_fsdp_at_tp1(tiny_model: Path) -> None:
    fsdp = one_step(str(tiny_model), "fsdp")
    megatron = one_step(str(tiny_model), "megatron", megatron_gradient_checkpointing=False)
    assert_same_step(megatron, fsdp)


def test_gradient_checkpointing_gives_the_same_step(tiny_model: Path) -> None:
    plain = one_step(str(tiny_model), "megatron", megatron_gradient_checkpointing=False)
    recomputed = one_step(str(tiny_model), "megatron", megatron_gradient_checkpointing=True)
    assert recomputed["metrics"]["loss"] == plain["metrics"]["loss"]
    for name, tensor in plain["after"].items():
        torch.testing.assert_close(recomputed["after"][name], tensor, atol=1e-7, rtol=0, msg=name)


def test_two_minibatches_and_warmup_follow_fsdp(tiny_model: Path) -> None:
    overrides = {"number_of_minibatches": 2, "lr_scheduler": "constant", "warmup_steps": 3}
    fsdp = one_step(str(tiny_model), "fsdp", **overrides)
    megatron = one_step(str(tiny_model), "megatron", megatron_gradient_checkpointing=False, **overrides)
    assert megatron["metrics"]["learning_rate"] == fsdp["metrics"]["learning_rate"]
    assert_same_step(megatron, fsdp)


def tp2_worker(rank: int, world_size: int, model: str, out: str) -> None:
    result = one_step(model, "megatron", rank, world_size, megatron_tensor_parallel_size=2, trainer_num_workers=2,
                      megatron_gradient_checkpointing=True)  # fmt: skip
    if rank == 0:
        torch.save(result, out)


@pytest.mark.slow
def test_one_step_equals_fsdp_at_tp2(tiny_model: Path, tmp_path: Path) -> None:
    spawn_ranks(tp2_worker, 2, str(tiny_model), str(tmp_path / "step.pt"))
    assert_same_step(torch.load(tmp_path / "step.pt", weights_only=False), one_step(str(tiny_model), "fsdp"))


def pp2_worker(rank: int, world_size: int, model: str, out: str, overrides: dict[str, Any]) -> None:
    result = one_step(model, "megatron", rank, world_size, megatron_pipeline_parallel_size=2,
                      trainer_num_workers=world_size, **overrides)  # fmt: skip
    if rank == 0:
        torch.save(result, out)


@pytest.mark.slow
def test_one_step_equals_fsdp_at_pp2(tiny_model: Path, tmp_path: Path) -> None:
    """Two pipeline stages (one layer each, the tied embedding on both ends), two micro-batches through the 1F1B schedule."""
    spawn_ranks(pp2_worker, 2, str(tiny_model), str(tmp_path / "step.pt"), {"megatron_gradient_checkpointing": False})
    assert_same_step(torch.load(tmp_path / "step.pt", weights_only=False), one_step(str(tiny_model), "fsdp"))
