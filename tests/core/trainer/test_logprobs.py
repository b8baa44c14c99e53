"""The trainer's log-probability helpers against exact values: the inference KL, and the greedy temperature rule."""

from __future__ import annotations

import math

import pytest
import torch

from telescope.inference.embedded.sampling import make_generator, sample
from telescope.trainer.logprobs import chunked_entropy, inference_kl_k3, token_logprobs

# (q, p): q is the sampler (inference policy), p the trainer's policy; both with full support.
PAIRS = [
    ([0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]),
    ([0.7, 0.2, 0.1], [0.1, 0.3, 0.6]),
    ([0.97, 0.01, 0.01, 0.01], [0.9, 0.05, 0.03, 0.02]),
]


def exact_kl(q: list[float], p: list[float]) -> float:
    """KL(q || p) = sum_x q(x) log(q(x) / p(x))."""
    return sum(qx * math.log(qx / px) for qx, px in zip(q, p, strict=True))


def exact_chi2(q: list[float], p: list[float]) -> float:
    """chi2(q || p) = sum_x q(x)^2 / p(x) - 1."""
    return sum(qx * qx / px for qx, px in zip(q, p, strict=True)) - 1.0


@pytest.mark.parametrize(("q", "p"), PAIRS)
def test_inference_kl_is_unbiased_for_kl_of_sampler_from_trainer(q: list[float], p: list[float]) -> None:
    """Tokens x ~ q: the exact expectation sum_x q(x) k3(x) equals KL(q || p)."""
    lp = torch.tensor(p, dtype=torch.float64).log()
    lp_inf = torch.tensor(q, dtype=torch.float64).log()
    per_token = inference_kl_k3(lp, lp_inf)
    assert per_token.dtype == torch.float64
    assert bool((per_token >= 0).all())
    expectation = float((torch.tensor(q, dtype=torch.float64) * per_token).sum())
    assert expectation == pytest.approx(exact_kl(q, p), abs=1e-12)
    # The reversed sign d = lp_inf - lp (the former formula) estimates chi2 - KL, not KL.
    d = lp_inf - lp
    reversed_sign = float((torch.tensor(q, dtype=torch.float64) * (torch.expm1(d) - d)).sum())
    assert reversed_sign == pytest.approx(exact_chi2(q, p) - exact_kl(q, p), abs=1e-12)
    assert abs(reversed_sign - exact_kl(q, p)) > 1e-3


def test_inference_kl_under_top_p_truncation_has_the_documented_bias() -> None:
    """q = p restricted to a nucleus of mass m, renormalised: E_q[k3] = KL(q || p) - (1 - m), KL = -log m."""
    p = [0.5, 0.3, 0.15, 0.05]
    nucleus = [0, 1]
    m = sum(p[i] for i in nucleus)
    q = [p[i] / m for i in nucleus]
    lp = torch.tensor([p[i] for i in nucleus], dtype=torch.float64).log()
    lp_inf = torch.tensor(q, dtype=torch.float64).log()
    expectation = float((torch.tensor(q, dtype=torch.float64) * inference_kl_k3(lp, lp_inf)).sum())
    assert expectation == pytest.approx(-math.log(m) - (1 - m), abs=1e-12)


def test_inference_kl_keeps_float32_and_has_no_gradient() -> None:
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    out = inference_kl_k3(lp, torch.tensor([-1.5, -1.0]))
    assert out.dtype == torch.float32 and not out.requires_grad


@pytest.mark.parametrize("temperature", [1e-6, 0.0])
def test_trainer_and_engine_agree_below_the_greedy_threshold(temperature: float) -> None:
    """Greedy temperatures: both report log_softmax(logits) (unscaled) of the argmax token."""
    torch.manual_seed(0)
    logits = torch.randn(5, 40) * 3.0
    rows = logits.shape[0]
    gens = [make_generator(i) for i in range(rows)]
    engine = sample(logits, [temperature] * rows, [0.5] * rows, gens, num_top=0)
    targets = torch.tensor(engine.token_ids)
    assert engine.token_ids == logits.argmax(dim=-1).tolist()
    trainer = token_logprobs(logits, targets, temperature)
    expected = [
        float(row[t]) - math.log(sum(math.exp(float(v)) for v in row))
        for row, t in zip(logits.double(), engine.token_ids, strict=True)
    ]
    assert engine.logprobs == pytest.approx(expected, abs=1e-5)
    assert trainer.tolist() == pytest.approx(engine.logprobs, abs=1e-6)
    entropy = chunked_entropy(logits, temperature, chunk_size=2)
    p = torch.softmax(logits.double(), dim=-1)
    assert entropy.tolist() == pytest.approx((-(p * p.log()).sum(-1)).tolist(), abs=1e-5)
