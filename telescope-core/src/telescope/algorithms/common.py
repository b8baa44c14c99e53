"""Pure helpers shared by the algorithms: baselines, normalisations, ratios, PPO clip.

``masked``, ``tis_weight``, ``kl_penalty``, ``per_sequence_sum`` and
``sequence_is_mask`` belong to the interface (the base class's ``loss_terms`` uses
them) and live in :mod:`telescope.api.algorithm`; they are re-exported here.

Everything here is a function of tensors and an :class:`AlgorithmConfig`. Standard
deviations are *population* standard deviations (``unbiased=False``): a group of
two rewards ``[0, 1]`` gets advantages ``[-1, 1]`` under group normalisation.
"""

from __future__ import annotations

import torch

from telescope.api.algorithm import (
    AlgorithmConfig,
    LossInputs,
    kl_penalty,
    masked,
    per_sequence_sum,
    sequence_is_mask,
    tis_weight,
)


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
    """``max(-rho A, -clip(rho, 1 - clip_low, 1 + clip_high) A)`` per token, dual-clipped when ``clip_ratio_c``.

    Dual clip (Ye et al. 2020), ``c = clip_ratio_c > 1``: for ``A < 0`` the loss is
    ``min(max(-rho A, -clip(rho) A), -c A)``, so a token whose ratio has grown far
    above ``c`` (an action the policy now strongly prefers, with a negative
    advantage) contributes at most ``-c A`` and no gradient; ``A >= 0`` is
    unchanged (there ``max(...) <= 0 < -c A`` would never bind anyway). It applies
    wherever this function is the loss: ``use_ppo_clip`` with grpo, rloo,
    reinforce_pp, dr_grpo, and gspo's sequence ratio; cispo and sapo have no such
    term and the config validator rejects ``clip_ratio_c`` with them.
    """
    clipped = torch.clamp(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high)
    loss = torch.maximum(-ratio * advantages, -clipped * advantages)
    if config.clip_ratio_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -config.clip_ratio_c * advantages), loss)
    return loss


def policy_gradient_loss(inputs: LossInputs, config: AlgorithmConfig) -> torch.Tensor:
    """``-A lp`` (REINFORCE), or the PPO-clipped ratio loss when ``use_ppo_clip``."""
    if config.use_ppo_clip:
        return ppo_clip_loss(torch.exp(log_ratio(inputs)), inputs.advantages, config)
    return -inputs.advantages * inputs.logprobs


__all__ = [
    "group_centred",
    "group_normalised",
    "kl_penalty",
    "log_ratio",
    "masked",
    "per_sequence_sum",
    "policy_gradient_loss",
    "ppo_clip_loss",
    "sequence_is_mask",
    "tis_weight",
]
