"""Token sampling and the log-probabilities the engine reports.

The distribution that the returned log-probabilities describe (the convention the
trainer shares, see ``reference/algorithms.md``):

    logprob(token) = log_softmax(logits / temperature)[token]

computed in float32 over the full vocabulary, *before* top-p truncation. The
trainer recomputes exactly this from its own logits, so with the same weights
the two agree to float rounding. With ``top_p < 1`` the sampler draws from the
truncated, renormalised nucleus, whose log-probability of the sampled token is
higher by ``-log(nucleus mass)``; that mismatch between the sampling and the
reported distribution is what truncated importance sampling (``use_tis``)
corrects. (vLLM's ``--logprobs-mode processed_logprobs`` reports the truncated
one instead; the two backends agree exactly when ``top_p`` is unset, the default.)

``temperature == 0`` means greedy decoding; its log-probabilities are those of
the unscaled distribution (``log_softmax(logits)``), as in vLLM.

Sampling uses the exponential race (``argmax(p / q)`` with ``q ~ Exp(1)``),
which draws exactly from ``p``. Each row draws its noise from its own
``torch.Generator``, so a seeded request samples the same tokens whatever else is
in the batch, as long as its logits are the same (padding in a batch can change
the last bits of a logit; see the engine's docstring).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GREEDY_EPS = 1e-5


@dataclass
class SampleOutput:
    """One token per row, its log-probability and, if asked, the top alternatives."""

    token_ids: list[int]
    logprobs: list[float]
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None


def scaled_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(logits / T)`` in float32; ``T == 0`` counts as ``T == 1``."""
    logits = logits.float()
    if temperature >= GREEDY_EPS:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


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
    generators: list[torch.Generator],
    num_top: int = 0,
) -> SampleOutput:
    """Sample one token per row of ``logits`` ``[B, V]``.

    ``num_top`` > 0 also returns the ``num_top`` most likely tokens of each row's
    reported distribution with their log-probabilities (the ``logprobs=k`` option).
    """
    rows = logits.shape[0]
    temps = torch.tensor([t if t >= GREEDY_EPS else 1.0 for t in temperatures], device=logits.device)
    logp = torch.log_softmax(logits.float() / temps.unsqueeze(-1), dim=-1)
    greedy = [t < GREEDY_EPS for t in temperatures]
    if all(greedy):
        chosen = logp.argmax(dim=-1)
    else:
        probs = logp.exp()
        if any(p < 1.0 for p in top_ps):
            top_p = torch.tensor(top_ps, device=logits.device, dtype=probs.dtype)
            probs = probs.masked_fill(top_p_mask(probs, top_p), 0.0)
        noise = torch.empty_like(probs)
        for i, gen in enumerate(generators):
            noise[i].exponential_(generator=gen)
        chosen = (probs / noise).argmax(dim=-1)
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


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A generator on ``device`` seeded with ``seed`` (reduced to 63 bits)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed & ((1 << 63) - 1))
    return gen
