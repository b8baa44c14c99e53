"""Token sampling and the log-probabilities the engine reports.

Which distribution each component describes (``T = logprob_temperature(temperature)``):

- the embedded engine samples from, and reports the log-probability of, the
  *processed* distribution: ``log_softmax(logits / T)`` over the full
  vocabulary, then, when ``top_p < 1``, restricted to the nucleus and
  renormalised, ``log(p_i / nucleus mass)`` (``-inf`` outside the nucleus).
  This is what vLLM reports with ``--logprobs-mode processed_logprobs`` (the
  ``vllm`` backend always sets it), so both backends report the distribution
  actually sampled from;
- the trainer (:mod:`telescope.trainer.logprobs`) computes ``log_softmax(logits
  / T)`` over the full vocabulary, never truncated.

So with ``top_p`` unset (the default) the engine and the trainer describe the same
distribution and agree to float rounding with the same weights. With ``top_p``
set, every sampled token's reported log-probability is higher than the trainer's
by ``-log(nucleus mass) >= 0``: the rollout policy ``q`` is the truncated one,
the trained policy ``p`` the full one. Truncated importance sampling (``use_tis``)
corrects part of that: its weight ``p / q`` gains the factor ``nucleus mass <= 1``
on every sampled token (never hitting the cap), which undoes the renormalisation.
It does *not* undo the truncation: tokens outside the nucleus are never sampled
(``q = 0``), so no weight on the sampled tokens can restore their share of the
policy gradient, and the estimate stays biased by the missing tail (``E_q[(p/q)
f] = sum over the nucleus of p f``, not ``E_p[f]``). Without ``use_tis`` nothing
corrects either part. The ``kl_divergence_inference`` metric counts the
truncation too (see :func:`telescope.trainer.logprobs.inference_kl_k3`).

Temperature below :data:`GREEDY_EPS` (``temperature == 0`` included) means greedy
decoding (argmax) with ``top_p`` ignored, and log-probabilities of the unscaled
distribution, ``log_softmax(logits)``, as vLLM does (its ``_SAMPLING_EPS`` is
the same 1e-5). :func:`~telescope.api.temperature.logprob_temperature` is that rule
(:mod:`telescope.api.temperature`); the trainer calls it too, so engine and
trainer agree at any temperature. Greedy tokens are not samples of the reported
distribution: neither TIS nor the KL metric sees that.

Sampling is by inverse transform: each row draws one uniform ``u`` in [0, 1) and takes
the first token whose cumulative probability exceeds ``u`` times the row's total. That
draws from ``p`` up to the rounding of the cumulative sum: float32, which torch
accumulates in double on the CPU and rounds once per entry (a boundary moves by at most
~6e-8), and on CUDA a float scan (~1e-6); a float64 sum cost 2.3x as much on the CPU.
Tokens of probability zero (outside the nucleus) are never
taken. The uniforms come from Python ``random.Random`` states on the host: a row with
its own (a seeded request) draws from it, so a seeded request samples the same tokens
whatever else is in the batch and on whatever device, as long as its logits are the
same (padding in a batch can change the last bits of a logit; see the engine's
docstring); rows without one (unseeded requests) draw in row order from the
``generator`` argument (the engine's own, seeded by its ``seed``). So a step costs one
uniform per row and one batched cumulative sum and search, never a random draw per
vocabulary entry: an exponential race (``argmax(p / q)``, ``q ~ Exp(1)``, what
``torch.multinomial`` and vLLM's seeded rows do) draws ``rows x vocabulary`` random
numbers per step. For 64 rows of a 151,936-token vocabulary on one CPU core,
``torch.multinomial`` (softmax included) takes 246 ms per step, this sampler 81-84 ms
(``bench/bench_sampling.py``, 2026-11-25).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from telescope.api.temperature import is_greedy, logprob_temperature


@dataclass
class SampleOutput:
    """One token per row, its log-probability and, if asked, the top alternatives."""

    token_ids: list[int]
    logprobs: list[float]
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None


def scaled_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(logits / T)`` in float32 with ``T = logprob_temperature(temperature)`` (no top-p)."""
    return torch.log_softmax(logits.float() / logprob_temperature(temperature), dim=-1)


def top_p_mask(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Boolean mask of the tokens outside each row's nucleus (``True`` = drop).

    Keeps the smallest set of most likely tokens whose mass reaches ``top_p``
    (always at least the most likely one). Rows with ``top_p >= 1`` drop nothing.
    """
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p.unsqueeze(-1)
    drop_sorted[:, 0] = False
    drop_sorted &= (top_p < 1.0).unsqueeze(-1)
    drop = torch.zeros_like(drop_sorted)
    drop.scatter_(-1, order, drop_sorted)
    return drop


def sample(
    logits: torch.Tensor,
    temperatures: list[float],
    top_ps: list[float],
    generators: Sequence[random.Random | None],
    num_top: int = 0,
    generator: random.Random | None = None,
) -> SampleOutput:
    """Sample one token per row of ``logits`` ``[B, V]``; report its processed log-probability.

    Each row's processed distribution is ``log_softmax(logits / T)``, restricted to
    the nucleus and renormalised when ``top_p < 1`` and the row is not greedy. The
    token is drawn from it (argmax when greedy) and its log-probability in it is
    reported. ``num_top`` > 0 also returns the ``num_top`` most likely tokens of
    each row's processed distribution with their log-probabilities (the
    ``logprobs=k`` option; ``-inf`` for tokens outside the nucleus). Rows whose
    entry in ``generators`` is None draw their uniform from ``generator`` (a fresh
    unseeded one when that is None too); greedy rows draw none.
    """
    rows = logits.shape[0]
    greedy = [is_greedy(t) for t in temperatures]
    scales = [logprob_temperature(t) for t in temperatures]
    if all(t == scales[0] for t in scales):
        scaled = logits.float() if scales[0] == 1.0 else logits.float() / scales[0]
    else:
        scaled = logits.float() / torch.tensor(scales, device=logits.device).unsqueeze(-1)
    logp = torch.log_softmax(scaled, dim=-1)
    row_top_p = [1.0 if g else p for g, p in zip(greedy, top_ps, strict=True)]
    if any(p < 1.0 for p in row_top_p):
        top_p = torch.tensor(row_top_p, device=logits.device, dtype=logp.dtype)
        drop = top_p_mask(logp.exp(), top_p)
        logp = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)
    if all(greedy):
        chosen = logp.argmax(dim=-1)
    else:
        shared = generator if generator is not None else random.Random()
        uniforms = [
            0.0 if g else (gen if gen is not None else shared).random()
            for g, gen in zip(greedy, generators, strict=True)
        ]
        chosen = inverse_transform(logp, uniforms)
        if any(greedy):
            mask = torch.tensor(greedy, device=logits.device)
            chosen = torch.where(mask, logp.argmax(dim=-1), chosen)
    chosen_logp = logp.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
    out = SampleOutput(token_ids=chosen.tolist(), logprobs=chosen_logp.tolist())
    if num_top > 0:
        k = min(num_top, logp.shape[-1])
        values, indices = logp.topk(k, dim=-1)
        out.top_ids = indices.tolist()
        out.top_logprobs = values.tolist()
    assert len(out.token_ids) == rows
    return out


def inverse_transform(logp: torch.Tensor, uniforms: list[float]) -> torch.Tensor:
    """Row ``r``'s token: the first whose cumulative probability exceeds ``uniforms[r]`` x the row's total."""
    cdf = logp.exp().cumsum(dim=-1)  # float32; see the module doc for its accuracy
    targets = torch.tensor(uniforms, dtype=cdf.dtype, device=cdf.device) * cdf[:, -1]
    chosen = torch.searchsorted(cdf, targets.unsqueeze(-1), right=True).squeeze(-1)
    return chosen.clamp_(max=logp.shape[-1] - 1)


def make_generator(seed: int) -> random.Random:
    """The uniforms of a seeded sequence (or of the engine's unseeded ones): a host RNG, device-independent."""
    return random.Random(seed)
