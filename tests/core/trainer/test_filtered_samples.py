"""A rollout an output filter masked (``Rollout.filtered``) adds nothing to the fsdp backend's step.

Its training sample keeps its tokens and advantage but has an all-false loss mask, so
it adds no loss tokens (token-mean denominators) and no counted sample (sample-mean
ones): the gradient equals that of the batch without it, for each aggregation.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from telescope.api.records import Rollout, Sample, TrainingSample, Turn
from telescope.plugins.facade import get_plugins
from telescope.testing.trainer import synthetic_batch, tiny_trainer_config
from telescope.trainer.fsdp import FSDPBackend

pytestmark = pytest.mark.timeout(300)


def gradient(model: Path, samples: list[TrainingSample], **overrides: object) -> dict[str, torch.Tensor]:
    config = tiny_trainer_config(model, **overrides)
    backend = get_plugins().create_trainer_backend(config, get_plugins().create_algorithm(config))
    assert isinstance(backend, FSDPBackend)
    backend.setup()
    try:
        backend.accumulate_gradients(samples)
        return backend.full_gradients()
    finally:
        backend.close()


def masked(sample: TrainingSample) -> TrainingSample:
    """The sample as :meth:`TrainingSample.from_rollout` makes it for a filtered rollout."""
    turn = Turn(sample.token_ids[:5], sample.token_ids[5:], sample.inference_logprobs[5:], 0)
    rollout = Rollout(Sample("p"), [turn], filtered=("repetition",))
    made = TrainingSample.from_rollout(rollout, sample.advantage)
    assert made.token_ids == sample.token_ids and not any(made.loss_mask)
    return dataclasses.replace(sample, loss_mask=made.loss_mask)


@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo", "gspo"])
def test_a_filtered_sample_leaves_the_gradient_as_without_it(tiny_model: Path, algorithm: str) -> None:
    samples = synthetic_batch(num_groups=2, group_size=2, seed=4).samples
    kept = [samples[0], samples[1], samples[3]]
    with_filtered = [samples[0], samples[1], masked(samples[2]), samples[3]]
    without = gradient(tiny_model, kept, algorithm=algorithm)
    filtered = gradient(tiny_model, with_filtered, algorithm=algorithm)
    scale = max(float(g.abs().max()) for g in without.values())
    assert scale > 1e-5
    for name, grad in without.items():
        torch.testing.assert_close(filtered[name], grad, rtol=1e-4, atol=1e-6 * scale, msg=name)


def test_a_batch_of_only_filtered_samples_steps_without_nan(tiny_model: Path) -> None:
    samples = [masked(s) for s in synthetic_batch(num_groups=1, group_size=2, seed=5).samples]
    grads = gradient(tiny_model, samples)
    assert all(math.isfinite(float(g.abs().sum())) and float(g.abs().max()) == 0.0 for g in grads.values())
