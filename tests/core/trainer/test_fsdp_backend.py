"""The fsdp backend through the trainer conformance kit, plus fsdp-specific behaviour."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from telescope.api.algorithm import LossInputs
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


def test_tis_weight_uses_the_batch_reference_after_the_first_optimizer_step(tiny_model: Path) -> None:
    """Two minibatches: on the second, the policy has moved and the TIS weight is pi_old / pi_inf.

    pi_old is computed here with plain transformers on the initial weights, one sample at a time.
    Each loss token gets a distinct rollout log-probability lp_old - u (u uniform in [-0.6, 0.6]), so
    the weight exp(u) sometimes exceeds the cap 1.5, and the rollout value identifies the token.
    """
    from transformers import AutoModelForCausalLM

    from telescope.api.records import TrainingBatch, TrainingSample

    cap = 1.5
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    rng = random.Random(7)
    old_by_rollout: dict[float, float] = {}
    samples: list[TrainingSample] = []
    for s in synthetic_batch(num_groups=2, seed=5).samples:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([s.token_ids])).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)[:-1].gather(-1, torch.tensor(s.token_ids[1:]).unsqueeze(-1))
        rollout_lp = [0.0] * len(s.token_ids)
        for t in range(1, len(s.token_ids)):
            if s.loss_mask[t]:
                old_lp = float(logp[t - 1])
                rollout_lp[t] = float(torch.tensor(old_lp - rng.uniform(-0.6, 0.6), dtype=torch.float32))
                old_by_rollout[rollout_lp[t]] = old_lp
        samples.append(dataclasses.replace(s, inference_logprobs=rollout_lp))
    batch = TrainingBatch(samples=samples, step=0, policy_version=0)

    backend = started(
        tiny_model,
        number_of_minibatches=2,
        use_ppo_clip=True,
        ppo_clip_ref_logprobs="batch",
        use_tis=True,
        tis_cap=cap,
        learning_rate=1e-2,
    )
    calls: list[tuple[LossInputs, torch.Tensor]] = []
    original = backend.algorithm.loss_terms

    def spy(inputs: LossInputs) -> torch.Tensor:
        terms = original(inputs)
        calls.append((inputs, terms.detach().clone()))
        return terms

    backend.algorithm.loss_terms = spy  # type: ignore[method-assign]
    try:
        backend.train_step(batch)
        clip_low, clip_high, clamp = (
            backend.algorithm.config.clip_low,
            backend.algorithm.config.clip_high,
            backend.algorithm.config.tis_logprob_clamp,
        )
    finally:
        backend.close()
    assert len(calls) == 2  # one packed sequence per minibatch

    def golden(
        lp: torch.Tensor, old: torch.Tensor, weight_lp: torch.Tensor, rollout: torch.Tensor, adv: torch.Tensor
    ) -> torch.Tensor:
        """PPO clip on lp / old, times min(exp(clamp(weight_lp - rollout)), cap)."""
        rho = torch.exp(lp - old)
        ppo = torch.maximum(-rho * adv, -rho.clamp(1 - clip_low, 1 + clip_high) * adv)
        return ppo * torch.exp((weight_lp - rollout).clamp(-clamp, clamp)).clamp(max=cap)

    for minibatch, (inputs, terms) in enumerate(calls):
        mask = inputs.loss_mask
        rollout = inputs.inference_logprobs[mask].double()
        old = torch.tensor([old_by_rollout[float(v)] for v in inputs.inference_logprobs[mask]], dtype=torch.float64)
        lp = inputs.logprobs.detach()[mask].double()
        adv = inputs.advantages[mask].double()
        assert torch.allclose(inputs.ref_logprobs[mask].double(), old, atol=1e-5)  # the batch reference is pi_old
        assert torch.allclose(terms[mask].double(), golden(lp, old, old, rollout, adv), atol=1e-5)
        moved = float((lp - old).abs().max())
        if minibatch == 0:
            assert moved < 1e-5
        else:  # after one optimizer step the current policy's weight would differ
            assert moved > 1e-3
            assert not torch.allclose(terms[mask].double(), golden(lp, old, lp, rollout, adv), atol=1e-4)


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
