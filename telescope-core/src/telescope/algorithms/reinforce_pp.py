"""REINFORCE++ (with group baseline): group-centred rewards, normalised across the batch.

Advantage ``r_i - mean(r)`` per group, then ``(A - mean_B(A)) / (std_B(A) + eps)``
over the whole training batch (``advantage_norm: batch``, its only and default
normalisation, applied by :meth:`~telescope.api.algorithm.Algorithm.advantages`).
"""

from __future__ import annotations

import torch

from telescope.algorithms import CAPABILITIES
from telescope.algorithms.common import group_centred, policy_gradient_loss
from telescope.api.algorithm import Algorithm, LossInputs


class ReinforcePP(Algorithm):
    name = "reinforce_pp"
    capabilities = CAPABILITIES["reinforce_pp"]

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return group_centred(rewards)

    def token_loss(self, inputs: LossInputs) -> torch.Tensor:
        return policy_gradient_loss(inputs, self.config)
