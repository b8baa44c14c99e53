"""The fsdp backend applies the shared loss controls as their formulas say, on a tiny model.

The regularisers add to the policy loss, so the gradient with a control on minus
the gradient with it off is the gradient of the control's term alone. That term is
computed here by hand with plain transformers, one sample at a time:

- KL penalty: ``tau * sum_t k(lp_t - lp_inf_t) / N`` (k2 ``d^2``, k3 ``min(e^d - 1 - d, 10)``);
- entropy bonus: ``-coef * sum_t H_t / N`` with ``H_t = -sum_v p log p`` of the full distribution;

``N`` being the loss tokens of the batch (the default token-mean aggregation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from telescope.api.records import TrainingSample
from telescope.plugins.facade import get_plugins
from telescope.testing.trainer import synthetic_batch, tiny_trainer_config
from telescope.trainer.fsdp import FSDPBackend
from telescope.trainer.logprobs import chunked_entropy, token_entropy


def started(model: Path, **overrides: object) -> FSDPBackend:
    config = tiny_trainer_config(model, **overrides)
    backend = get_plugins().create_trainer_backend(config, get_plugins().create_algorithm(config))
    backend.setup()
    return backend  # type: ignore[return-value]


def backend_gradient(model: Path, samples: list[TrainingSample], **overrides: object) -> dict[str, torch.Tensor]:
    backend = started(model, **overrides)
    try:
        backend.accumulate_gradients(samples)
        return backend.full_gradients()
    finally:
        backend.close()


def hf_model(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def per_token(model: Any, sample: TrainingSample) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lp, lp_inf, entropy, mask) of the sample's targets, lp and entropy with gradient (temperature 1)."""
    ids = torch.tensor([sample.token_ids])
    logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    log_p = torch.log_softmax(logits, dim=-1)
    lp = log_p.gather(-1, ids[0, 1:, None])[:, 0]
    entropy = -(log_p.exp() * log_p).sum(-1)
    inf = torch.tensor(sample.inference_logprobs[1:], dtype=torch.float32)
    return lp, inf, entropy, torch.tensor(sample.loss_mask[1:])


def hand_gradient(model: Any, samples: list[TrainingSample], term: Any) -> dict[str, torch.Tensor]:
    """Gradient of ``sum over loss tokens of term(lp, lp_inf, H) / N``."""
    model.zero_grad(set_to_none=True)
    total, tokens = torch.zeros(()), 0
    for sample in samples:
        lp, inf, entropy, mask = per_token(model, sample)
        total = total + term(lp, inf, entropy)[mask].sum()
        tokens += int(mask.sum())
    (total / tokens).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_difference_is(on: dict, off: dict, expected: dict) -> None:
    scale = max(float(g.abs().max()) for g in expected.values())
    assert scale > 1e-4  # the term has a real gradient
    for name, grad in expected.items():
        torch.testing.assert_close(on[name] - off[name], grad, rtol=1e-3, atol=1e-5 * scale, msg=name)


TAU, COEF = 0.3, 0.05


def kl_term(estimator: str) -> Any:
    def term(lp: torch.Tensor, inf: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
        d = (lp - inf).clamp(-20, 20)
        return TAU * (d * d if estimator == "k2" else (torch.exp(d) - 1 - d).clamp(max=10.0))

    return term


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_kl_penalty_changes_the_gradient_by_its_formula(tiny_model: Path, estimator: str) -> None:
    samples = synthetic_batch(num_groups=2).samples
    off = backend_gradient(tiny_model, samples)
    on = backend_gradient(tiny_model, samples, kl_penalty_tau=TAU, kl_estimator=estimator)
    assert_difference_is(on, off, hand_gradient(hf_model(tiny_model), samples, kl_term(estimator)))


def test_entropy_bonus_changes_the_gradient_by_its_formula(tiny_model: Path) -> None:
    samples = synthetic_batch(num_groups=2).samples
    coef = 2.0  # the untrained model is near uniform: its entropy's gradient is small
    off = backend_gradient(tiny_model, samples)
    on = backend_gradient(tiny_model, samples, entropy_coef=coef)  # entropy_chunk_size 16: several chunks
    expected = hand_gradient(hf_model(tiny_model), samples, lambda lp, inf, entropy: -coef * entropy)
    assert_difference_is(on, off, expected)


def test_metrics_of_the_loss_controls(tiny_model: Path) -> None:
    """kl and entropy parts: sums over the *kept* tokens / all loss tokens; the count of dropped samples."""
    batch = synthetic_batch(num_groups=2)
    model = hf_model(tiny_model)
    kept_kl = kept_entropy = entropy_sum = 0.0
    tokens = dropped = 0
    with torch.no_grad():
        for sample in batch.samples:
            lp, inf, entropy, mask = per_token(model, sample)
            d = (lp - inf)[mask]
            entropy_sum += float(entropy[mask].sum())
            tokens += int(mask.sum())
            if 0.5 <= float(torch.exp(d.mean())) <= 2.0:  # geometric mean of pi / pi_inf inside the bounds
                kept_kl += float((d * d).sum())
                kept_entropy += float(entropy[mask].sum())
            else:
                dropped += 1
    backend = started(
        tiny_model,
        kl_penalty_tau=TAU,
        entropy_coef=COEF,
        seq_is_masking=True,
        seq_is_mask_low=0.5,
        seq_is_mask_high=2.0,
    )
    try:
        metrics = backend.train_step(batch)
    finally:
        backend.close()
    assert 0 < dropped < len(batch.samples), "the synthetic batch should have sequences on both sides"
    assert metrics["seq_is/masked_sequences"] == dropped
    assert metrics["loss/kl_penalty"] == pytest.approx(TAU * kept_kl / tokens, rel=1e-4)
    assert metrics["loss/entropy_bonus"] == pytest.approx(COEF * kept_entropy / tokens, rel=1e-4)
    assert metrics["entropy"] == pytest.approx(entropy_sum / tokens, rel=1e-4)  # the metric covers every token


def test_controls_off_report_no_metrics(tiny_model: Path) -> None:
    backend = started(tiny_model)
    try:
        metrics = backend.train_step(synthetic_batch())
    finally:
        backend.close()
    assert not {"loss/kl_penalty", "loss/entropy_bonus", "seq_is/masked_sequences"} & set(metrics)


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 64])
def test_token_entropy_has_the_gradient_of_the_entropy(chunk_size: int) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(7, 11, generator=gen) * 3).requires_grad_(True)
    weights = torch.rand(7, generator=gen)
    values = token_entropy(logits, 0.7, chunk_size)
    torch.testing.assert_close(values.detach(), chunked_entropy(logits.detach(), 0.7, chunk_size))
    (values * weights).sum().backward()
    reference = logits.detach().clone().requires_grad_(True)
    log_p = torch.log_softmax(reference / 0.7, dim=-1)
    (-(log_p.exp() * log_p).sum(-1) * weights).sum().backward()
    assert logits.grad is not None and reference.grad is not None
    torch.testing.assert_close(logits.grad, reference.grad)
