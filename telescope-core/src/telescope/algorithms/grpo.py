"""GRPO: group-normalised advantages, REINFORCE token loss (optionally PPO-clipped).

Advantage ``(r_i - mean(r)) / (std(r) + eps)`` (population std); per-token loss
``-A_i lp_t``, or ``max(-rho A, -clip(rho) A)`` with ``use_ppo_clip``.
"""

from __future__ import annotations

import torch

from telescope.algorithms import CAPABILITIES
from telescope.algorithms.common import group_normalised, policy_gradient_loss
from telescope.api.algorithm import Algorithm, LossInputs


class GRPO(Algorithm):
    name = "grpo"
    capabilities = CAPABILITIES["grpo"]

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return group_normalised(rewards, self.config)

    def token_loss(self, inputs: LossInputs) -> torch.Tensor:
        return policy_gradient_loss(inputs, self.config)
