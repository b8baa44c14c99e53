"""Dr. GRPO ("GRPO done right"): no std division, optional length-unbiased aggregation.

Advantage ``r_i - mean(r)``. ``dr_grpo_loss_agg_mode``:

- ``token_mean``: the default global mean over loss tokens.
- ``token_sum_norm``: the summed token losses divided by ``samples x max_tokens``
  (a constant generation budget), removing the bias of per-length averaging.
"""

from __future__ import annotations

import torch

from telescope.algorithms import CAPABILITIES
from telescope.algorithms.common import group_centred, policy_gradient_loss
from telescope.algorithms.plugin import DrGrpoSettings
from telescope.api.algorithm import Algorithm, AlgorithmConfig, LossCounts, LossInputs


class DrGRPO(Algorithm):
    name = "dr_grpo"
    capabilities = CAPABILITIES["dr_grpo"]

    def __init__(self, config: AlgorithmConfig, settings: DrGrpoSettings | None = None) -> None:
        super().__init__(config, settings)
        self.aggregation = (settings or DrGrpoSettings()).dr_grpo_loss_agg_mode

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return group_centred(rewards)

    def token_loss(self, inputs: LossInputs) -> torch.Tensor:
        return policy_gradient_loss(inputs, self.config)

    def loss_denominator(self, counts: LossCounts) -> float:
        if self.aggregation == "token_sum_norm":
            return float(max(counts.samples, 1) * self.config.max_tokens)
        return super().loss_denominator(counts)
