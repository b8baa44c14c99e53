"""float16 dynamic loss scaling: megatron-core's rules, and the backend's float16 step.

The rules (:class:`~telescope_megatron.loss_scaling.DynamicLossScale`): an overflow skips
the step and, once the hysteresis is spent, halves the scale; ``growth_interval`` good
steps double it. The backend: with float16 compute the loss is scaled and the
gradients unscaled before the norm (the reported norm is the float32 step's within
float16 rounding: measured 6.1e-5 relative, held to 1e-3, where a missing unscale would
be off by the scale, 1024x), the scale is reported as ``optimizer/loss_scale``, a
step with a non-finite gradient leaves the weights as they were and halves the scale,
good steps raise it again, and a checkpoint's training state carries the scale and its
counters.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from telescope_megatron.loss_scaling import DynamicLossScale
from tests.megatron.test_training import LENGTHS, make_backend

from telescope.testing.trainer import max_weight_diff, synthetic_batch, weights_snapshot


def test_an_overflow_halves_the_scale_once_the_hysteresis_is_spent() -> None:
    scale = DynamicLossScale(scale=1024.0, hysteresis=2)
    scale.update(found_inf=True)
    assert scale.scale == 1024.0  # the first overflow spends the hysteresis (megatron-core's default, 2)
    scale.update(found_inf=False)  # a good step does not restore it
    scale.update(found_inf=True)
    assert scale.scale == 512.0
    scale.update(found_inf=True)
    assert scale.scale == 256.0


def test_good_steps_raise_the_scale_and_restore_the_hysteresis() -> None:
    scale = DynamicLossScale(scale=8.0, growth_interval=3, hysteresis=1)
    for expected in (8.0, 8.0, 16.0, 16.0, 16.0, 32.0):
        scale.update(found_inf=False)
        assert scale.scale == expected
    scale.update(found_inf=False)
    scale.update(found_inf=True)  # the overflow resets the run of good steps
    assert scale.scale == 16.0
    for expected in (16.0, 16.0, 32.0):
        scale.update(found_inf=False)
        assert scale.scale == expected


def test_the_scale_stops_at_its_minimum_and_survives_a_state_dict() -> None:
    scale = DynamicLossScale(scale=4.0, min_scale=2.0, hysteresis=1)
    for _ in range(3):
        scale.update(found_inf=True)
    assert scale.scale == 2.0
    copy = DynamicLossScale()
    copy.load_state_dict(scale.state_dict())
    assert (copy.scale, copy.good_steps, copy.hysteresis_left) == (2.0, 0, scale.hysteresis_left)


def test_megatron_cores_defaults() -> None:
    scale = DynamicLossScale()
    assert (scale.scale, scale.min_scale, scale.growth_interval, scale.hysteresis) == (2.0**32, 1.0, 1000, 2)
    with pytest.raises(ValueError, match="backoff_factor"):
        DynamicLossScale(backoff_factor=1.0)


def poisoned(seed: int) -> object:
    """A batch whose first sample has an infinite advantage: every gradient becomes non-finite."""
    batch = synthetic_batch(completion_lengths=LENGTHS, seed=seed)
    first = dataclasses.replace(batch.samples[0], advantage=float("inf"))
    return dataclasses.replace(batch, samples=[first, *batch.samples[1:]])


def test_float16_scales_the_loss_skips_an_overflow_and_grows_back(tiny_model: Path, tmp_path: Path) -> None:
    reference = make_backend(str(tiny_model), "megatron", megatron_gradient_checkpointing=False)
    reference.setup(0, 1, "cpu")
    try:
        float32 = reference.train_step(synthetic_batch(completion_lengths=LENGTHS))
        assert "optimizer/loss_scale" not in float32  # no scaling outside float16
    finally:
        reference.close()

    backend = make_backend(
        str(tiny_model), "megatron", megatron_gradient_checkpointing=False, mixed_precision_dtype="float16"
    )
    backend.setup(0, 1, "cpu")
    try:
        assert {p.dtype for p in backend.model.parameters()} == {torch.float16}
        backend.loss_scaler = DynamicLossScale(scale=1024.0, growth_interval=2, hysteresis=1)  # type: ignore[attr-defined]
        good = backend.train_step(synthetic_batch(completion_lengths=LENGTHS))
        # the gradients were unscaled before the norm: the float32 step's norm within float16 rounding
        assert good["grad_norm"] == pytest.approx(float32["grad_norm"], rel=1e-3)
        assert good["optimizer/skipped_steps"] == 0.0 and good["optimizer/loss_scale"] == 1024.0

        before = weights_snapshot(backend)
        skipped = backend.train_step(poisoned(1))  # type: ignore[arg-type]
        assert skipped["optimizer/skipped_steps"] == 1.0
        assert skipped["optimizer/loss_scale"] == 512.0
        assert max_weight_diff(before, weights_snapshot(backend)) == 0.0

        rates = [backend.train_step(synthetic_batch(completion_lengths=LENGTHS, seed=s)) for s in (2, 3)]
        assert [r["optimizer/skipped_steps"] for r in rates] == [0.0, 0.0]
        assert [r["optimizer/loss_scale"] for r in rates] == [512.0, 1024.0]  # two good steps: doubled
        assert max_weight_diff(before, weights_snapshot(backend)) > 0
        backend.train_step(poisoned(4))  # type: ignore[arg-type]
        backend.save_checkpoint(tmp_path / "ckpt", training_state=True)
        saved = backend.loss_scaler.state_dict()  # type: ignore[attr-defined]
    finally:
        backend.close()
    assert saved == {"scale": 512.0, "good_steps": 0, "hysteresis_left": 0}
    resumed = make_backend(
        str(tiny_model), "megatron", megatron_gradient_checkpointing=False, mixed_precision_dtype="float16"
    )
    resumed.setup(0, 1, "cpu")
    try:
        resumed.load_checkpoint(tmp_path / "ckpt")
        assert resumed.loss_scaler.state_dict() == saved  # type: ignore[attr-defined]
    finally:
        resumed.close()
