"""The algorithm conformance kit catches broken algorithms (and passes good ones)."""

from __future__ import annotations

import pytest
import torch

from telescope.algorithms import CAPABILITIES
from telescope.algorithms.grpo import GRPO
from telescope.api.algorithm import LossInputs
from telescope.testing.algorithm import AlgorithmConformance


class IgnoresMask(GRPO):
    def loss_terms(self, inputs: LossInputs) -> torch.Tensor:
        return self.token_loss(inputs)


class WrongSign(GRPO):
    def token_loss(self, inputs: LossInputs) -> torch.Tensor:
        return inputs.advantages * inputs.logprobs


class StdOnly(GRPO):
    capabilities = CAPABILITIES["grpo"]

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return rewards / (rewards.std() + 1e-6)


def kit_for(cls: type) -> AlgorithmConformance:
    kit = AlgorithmConformance()
    kit.algorithm_class = cls  # type: ignore[misc]
    return kit


def test_kit_rejects_an_algorithm_that_ignores_the_mask() -> None:
    with pytest.raises(AssertionError):
        kit_for(IgnoresMask).test_mask_respected()


def test_kit_rejects_a_wrong_gradient_sign() -> None:
    with pytest.raises(AssertionError):
        kit_for(WrongSign).test_ratio_one_gradient_is_policy_gradient()


def test_kit_rejects_nonzero_advantages_for_equal_rewards() -> None:
    with pytest.raises(AssertionError):
        kit_for(StdOnly).test_zero_variance_group_gives_zero_advantages()


def test_kit_passes_grpo() -> None:
    kit = kit_for(GRPO)
    kit.test_mask_respected()
    kit.test_ratio_one_gradient_is_policy_gradient()
    kit.test_zero_variance_group_gives_zero_advantages()
