"""Trainer-side recomputation used by the correctness tests (plain transformers)."""

from __future__ import annotations

import torch


def trainer_logprobs(
    model: torch.nn.Module, prompt: list[int], completion: list[int], temperature: float
) -> torch.Tensor:
    """log_softmax(logits / T) of each completion token, recomputed from the full sequence."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    t = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits / t, dim=-1)
    return logp[len(prompt) - 1 : -1].gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)


def mean_k3(inference: list[float], trainer: torch.Tensor) -> float:
    d = torch.tensor(inference) - trainer
    return float((torch.exp(d) - 1 - d).mean())
