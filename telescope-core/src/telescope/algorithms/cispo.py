"""CISPO (MiniMax-M1): clipped, detached importance weight on a REINFORCE loss.

Per token ``-sg(clip(rho, 1 - clip_low, 1 + clip_high)) A lp``: the weight is
detached, so every token keeps a gradient (no token is zeroed by the clip, unlike PPO).
There is no ``max(-rho A, -clip(rho) A)`` term, so dual clipping (``clip_ratio_c``)
does not apply (the validator rejects it).
"""

from __future__ import annotations

import torch

from telescope.algorithms import CAPABILITIES
from telescope.algorithms.common import group_normalised, log_ratio
from telescope.api.algorithm import Algorithm, LossInputs


class CISPO(Algorithm):
    name = "cispo"
    capabilities = CAPABILITIES["cispo"]

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return group_normalised(rewards, self.config)

    def token_loss(self, inputs: LossInputs) -> torch.Tensor:
        ratio = torch.exp(log_ratio(inputs)).detach()
        weight = torch.clamp(ratio, 1.0 - self.config.clip_low, 1.0 + self.config.clip_high)
        return -weight * inputs.advantages * inputs.logprobs
