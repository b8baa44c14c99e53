"""Log-probabilities and entropy of the temperature-scaled next-token distribution.

Both read logits ``[S, V]`` (one packed sequence) and work in float32. The
log-probability of a target is ``z[target] - logsumexp(z)`` with
``z = logits / temperature``, which never materialises a full log-softmax. The
entropy is a metric (no gradient) computed ``chunk_size`` positions at a time, so
at most ``chunk_size x V`` probabilities exist at once.
"""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log softmax(logits / temperature)[targets]`` per position, shape ``[S]`` (float32, with gradient)."""
    scaled = logits.float() / temperature
    picked = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


@torch.no_grad()
def chunked_entropy(logits: torch.Tensor, temperature: float = 1.0, chunk_size: int = 1024) -> torch.Tensor:
    """Entropy ``-sum p log p`` of ``softmax(logits / temperature)`` per position, shape ``[S]``."""
    out = torch.empty(logits.shape[:-1], dtype=torch.float32, device=logits.device)
    for start in range(0, logits.shape[0], max(chunk_size, 1)):
        z = logits[start : start + chunk_size].float() / temperature
        log_p = torch.log_softmax(z, dim=-1)
        out[start : start + chunk_size] = -(log_p.exp() * log_p).sum(-1)
    return out


def k3_kl(logprobs: torch.Tensor, inference_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator ``exp(d) - 1 - d`` with ``d = lp_inf - lp`` (no gradient)."""
    d = (inference_logprobs - logprobs.detach()).float()
    return torch.expm1(d) - d
