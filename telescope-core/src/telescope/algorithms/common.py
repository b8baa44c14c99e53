"""Pure helpers shared by the algorithms: baselines, normalisations, ratios, PPO clip.

``masked`` and ``tis_weight`` belong to the interface (the base class's ``loss_terms``
uses them) and live in :mod:`telescope.api.algorithm`; they are re-exported here.

Everything here is a function of tensors and an :class:`AlgorithmConfig`. Standard
deviations are *population* standard deviations (``unbiased=False``): a group of
two rewards ``[0, 1]`` gets advantages ``[-1, 1]`` under group normalisation.
"""

from __future__ import annotations

import torch

from telescope.api.algorithm import AlgorithmConfig, LossInputs, masked, tis_weight


def group_centred(rewards: torch.Tensor) -> torch.Tensor:
    """``r_i - mean(r)``."""
    return rewards - rewards.mean()


def group_normalised(rewards: torch.Tensor, config: AlgorithmConfig) -> torch.Tensor:
    """The GRPO family's advantage: ``(r - mean) / (std + eps)`` under ``advantage_norm: group``.

    Under ``advantage_norm: batch`` the batch normalisation replaces the group std
    division, so only the group mean is removed here.
    """
    centred = group_centred(rewards)
    if config.advantage_norm == "batch":
        return centred
    return centred / (rewards.std(unbiased=False) + config.eps)


def log_ratio(inputs: LossInputs) -> torch.Tensor:
    """``lp - lp_ref`` on loss tokens, 0 elsewhere (so ``exp`` never overflows on padding)."""
    return masked(inputs.logprobs - inputs.ref_logprobs, inputs.loss_mask)


def ppo_clip_loss(ratio: torch.Tensor, advantages: torch.Tensor, config: AlgorithmConfig) -> torch.Tensor:
    """``max(-rho A, -clip(rho, 1 - clip_low, 1 + clip_high) A)`` per token."""
    clipped = torch.clamp(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high)
    return torch.maximum(-ratio * advantages, -clipped * advantages)


def policy_gradient_loss(inputs: LossInputs, config: AlgorithmConfig) -> torch.Tensor:
    """``-A lp`` (REINFORCE), or the PPO-clipped ratio loss when ``use_ppo_clip``."""
    if config.use_ppo_clip:
        return ppo_clip_loss(torch.exp(log_ratio(inputs)), inputs.advantages, config)
    return -inputs.advantages * inputs.logprobs


__all__ = [
    "group_centred",
    "group_normalised",
    "log_ratio",
    "masked",
    "policy_gradient_loss",
    "ppo_clip_loss",
    "tis_weight",
]
