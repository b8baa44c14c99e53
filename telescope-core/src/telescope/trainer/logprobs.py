"""Log-probabilities, entropy and the inference KL of the temperature-scaled next-token distribution.

The first two read logits ``[S, V]`` (one packed sequence) and work in float32.
The log-probability of a target is ``z[target] - logsumexp(z)`` with ``z = logits
/ T``, which never materialises a full log-softmax. ``T`` is
:func:`~telescope.api.temperature.logprob_temperature` of the
configured temperature, the rule the inference engine applies too: the
temperature itself, or 1 below the greedy threshold (where the engine, like vLLM,
decodes greedily and reports the unscaled log-softmax). The trainer's
distribution is over the full vocabulary: it never applies top-p (the engine's
reported log-probabilities do, when ``top_p`` is set; see
:mod:`telescope.inference.embedded.sampling`). The entropy is a metric (no
gradient) computed ``chunk_size`` positions at a time, so at most ``chunk_size x
V`` probabilities exist at once; :func:`token_entropy` is the same quantity with
gradient (for the ``entropy_coef`` bonus), recomputed chunk by chunk in the
backward pass to keep that bound.
"""

from __future__ import annotations

import torch

from telescope.api.temperature import logprob_temperature


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log softmax(logits / T)[targets]`` per position, shape ``[S]`` (float32, with gradient).

    ``T = logprob_temperature(temperature)``.
    """
    scaled = logits.float() / logprob_temperature(temperature)
    picked = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


@torch.no_grad()
def chunked_entropy(logits: torch.Tensor, temperature: float = 1.0, chunk_size: int = 1024) -> torch.Tensor:
    """Entropy ``-sum p log p`` of ``softmax(logits / T)`` per position, shape ``[S]``."""
    t = logprob_temperature(temperature)
    out = torch.empty(logits.shape[:-1], dtype=torch.float32, device=logits.device)
    for start in range(0, logits.shape[0], max(chunk_size, 1)):
        z = logits[start : start + chunk_size].float() / t
        log_p = torch.log_softmax(z, dim=-1)
        out[start : start + chunk_size] = -(log_p.exp() * log_p).sum(-1)
    return out


def _entropy_rows(logits: torch.Tensor, t: float) -> torch.Tensor:
    log_p = torch.log_softmax(logits.float() / t, dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0, chunk_size: int = 1024) -> torch.Tensor:
    """Entropy ``H = -sum p log p`` of ``p = softmax(logits / T)`` per position, shape ``[S]``, *with* gradient.

    ``dH/dz_v = -p_v (log p_v + H) / T``. Each chunk of ``chunk_size`` positions is
    activation-checkpointed: the forward keeps only the chunk's logits (a view of
    the input), and the backward recomputes that chunk's softmax, so at most
    ``chunk_size x V`` float32 probabilities (and their gradient) exist at once, in
    the forward and in the backward pass. Values equal :func:`chunked_entropy`'s.
    """
    from torch.utils.checkpoint import checkpoint

    t = logprob_temperature(temperature)
    step = max(chunk_size, 1)
    parts = [
        checkpoint(_entropy_rows, logits[start : start + step], t, use_reentrant=False)
        for start in range(0, logits.shape[0], step)
    ]
    if not parts:
        return logits.new_zeros(logits.shape[:-1], dtype=torch.float32)
    return torch.cat(parts)


def inference_kl_k3(logprobs: torch.Tensor, inference_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of ``KL(pi_inf || pi)``: ``exp(d) - 1 - d`` with ``d = lp - lp_inf`` (no gradient).

    The tokens were drawn from the sampler ``q = pi_inf``, and with ``r = p / q``,
    ``E_q[r - 1 - log r] = (1 - 1) + KL(q || p)``: unbiased for ``KL(pi_inf ||
    pi)`` and non-negative per token (``e^d >= 1 + d``). It is the
    ``kl_divergence_inference`` metric, the distance between the policy being
    trained and the one that generated the data (staleness plus numerical mismatch).
    The other sign, ``d = lp_inf - lp``, has expectation ``chi2(q || p) - KL(q || p)``,
    not a KL. Limit: unbiasedness needs ``E_q[r] = 1``, i.e. ``q > 0`` wherever
    ``p > 0``. Top-p truncation breaks it: the per-position expectation is then
    ``KL(q || p) - (1 - nucleus mass)`` with ``KL(q || p) = -log(nucleus mass)``.
    """
    d = logprobs.detach() - inference_logprobs
    d = d.to(torch.promote_types(d.dtype, torch.float32))  # float32 at least; float64 stays float64
    return torch.expm1(d) - d
