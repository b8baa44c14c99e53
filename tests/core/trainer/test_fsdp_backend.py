"""The fsdp backend through the trainer conformance kit, plus fsdp-specific behaviour."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from telescope.api.context import TrainerContext
from telescope.plugins.facade import get_plugins
from telescope.testing.trainer import (
    TrainerBackendConformance,
    synthetic_batch,
    tiny_trainer_config,
    weights_snapshot,
)
from telescope.trainer.fsdp import FSDPBackend
from telescope.trainer.plugin import FSDPSettings


class TestFSDPBackend(TrainerBackendConformance):
    backend_name = "fsdp"


def started(model: Path, **overrides: object) -> FSDPBackend:
    config = tiny_trainer_config(model, **overrides)
    backend = get_plugins().create_trainer_backend(config, get_plugins().create_algorithm(config))
    backend.setup()
    return backend


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "dr_grpo", "reinforce_pp", "cispo", "gspo", "sapo"])
def test_every_algorithm_trains(tiny_model: Path, algorithm: str) -> None:
    backend = started(tiny_model, algorithm=algorithm)
    try:
        before = weights_snapshot(backend)
        metrics = backend.train_step(synthetic_batch())
        after = weights_snapshot(backend)
    finally:
        backend.close()
    assert metrics["loss"] == metrics["loss"] and metrics["grad_norm"] > 0
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_minibatches_and_batch_reference(tiny_model: Path) -> None:
    backend = started(
        tiny_model, number_of_minibatches=2, use_ppo_clip=True, ppo_clip_ref_logprobs="batch", use_tis=True
    )
    try:
        metrics = backend.train_step(synthetic_batch(num_groups=4))
    finally:
        backend.close()
    assert metrics["optimizer/steps"] == 2.0


def test_custom_backend_adds_metrics(tiny_model: Path) -> None:
    class MyBackend(FSDPBackend):
        def train_step(self, batch):  # type: ignore[no-untyped-def]
            metrics = super().train_step(batch)
            metrics["custom/my_metric"] = 1.0
            return metrics

    config = tiny_trainer_config(tiny_model)
    backend = MyBackend(
        TrainerContext.from_config(config), get_plugins().create_algorithm(config), config.settings(FSDPSettings)
    )
    backend.setup()
    try:
        assert backend.train_step(synthetic_batch())["custom/my_metric"] == 1.0
    finally:
        backend.close()


def test_gradient_checkpointing_and_bf16_mixed_precision_run_on_cpu(tiny_model: Path) -> None:
    backend = started(tiny_model, gradient_checkpointing=True, mixed_precision_dtype="bfloat16")
    try:
        metrics = backend.train_step(synthetic_batch())
    finally:
        backend.close()
    assert metrics["grad_norm"] > 0 and metrics["entropy"] > 0


def test_truncated_samples_are_counted(tiny_model: Path) -> None:
    batch = synthetic_batch(prompt_length=10, completion_lengths=(60, 60))  # 70 tokens > seq_len 64
    backend = started(tiny_model)
    try:
        metrics = backend.train_step(batch)
    finally:
        backend.close()
    assert metrics["packing/truncated_samples"] == 4.0
