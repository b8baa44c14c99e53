"""SAPO (soft adaptive policy optimisation): a smooth sigmoid gate instead of a hard clip.

Per token ``-(4 / tau) sigmoid(tau (rho - 1)) A`` with ``tau = sapo_tau_pos`` when
``A > 0`` else ``sapo_tau_neg``. Its derivative in ``lp`` is
``-4 sigmoid'(tau (rho - 1)) rho A``, which equals ``-A`` at ``rho = 1``: on-policy it
is the plain policy gradient, and it fades smoothly as the ratio moves away.
The gate already bounds the loss (``|loss| <= 4 |A| / tau``), so dual clipping
(``clip_ratio_c``) does not apply (the validator rejects it).
"""

from __future__ import annotations

import torch

from telescope.algorithms import CAPABILITIES
from telescope.algorithms.common import group_normalised, log_ratio
from telescope.algorithms.plugin import SapoSettings
from telescope.api.algorithm import Algorithm, AlgorithmConfig, LossInputs


class SAPO(Algorithm):
    name = "sapo"
    capabilities = CAPABILITIES["sapo"]

    def __init__(self, config: AlgorithmConfig, settings: SapoSettings | None = None) -> None:
        super().__init__(config, settings)
        self.sapo = settings or SapoSettings()

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return group_normalised(rewards, self.config)

    def token_loss(self, inputs: LossInputs) -> torch.Tensor:
        ratio = torch.exp(log_ratio(inputs))
        tau = torch.where(
            inputs.advantages > 0,
            torch.full_like(ratio, self.sapo.sapo_tau_pos),
            torch.full_like(ratio, self.sapo.sapo_tau_neg),
        )
        return -(4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)) * inputs.advantages
