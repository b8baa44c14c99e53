"""RLOO: leave-one-out baseline, REINFORCE token loss (optionally PPO-clipped).

Advantage ``r_i - mean_{j != i} r_j``, computed as ``(r_i - mean(r)) * n / (n - 1)``.
"""

from __future__ import annotations

import torch

from telescope.algorithms import CAPABILITIES
from telescope.algorithms.common import group_centred, policy_gradient_loss
from telescope.api.algorithm import Algorithm, LossInputs


class RLOO(Algorithm):
    name = "rloo"
    capabilities = CAPABILITIES["rloo"]

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        n = rewards.numel()
        return group_centred(rewards) * (n / (n - 1))

    def token_loss(self, inputs: LossInputs) -> torch.Tensor:
        return policy_gradient_loss(inputs, self.config)
