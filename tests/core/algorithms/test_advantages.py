"""Golden advantages, computed by hand in the comments (population std, eps = 1e-6)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from telescope.algorithms.cispo import CISPO
from telescope.algorithms.dr_grpo import DrGRPO
from telescope.algorithms.grpo import GRPO
from telescope.algorithms.gspo import GSPO
from telescope.algorithms.reinforce_pp import ReinforcePP
from telescope.algorithms.rloo import RLOO
from telescope.algorithms.sapo import SAPO
from telescope.api.algorithm import Algorithm, AlgorithmConfig

GROUP = AlgorithmConfig(advantage_norm="group")
BATCH = AlgorithmConfig(advantage_norm="batch")


@pytest.mark.parametrize("cls", [GRPO, CISPO, GSPO, SAPO])
def test_group_normalised(cls: type) -> None:
    # [1, 2, 3]: mean 2, std sqrt(2/3) = 0.816497 -> (r - 2) / 0.816497 = [-1.224745, 0, 1.224745]
    assert cls(GROUP).advantages([[1.0, 2.0, 3.0]]) == [pytest.approx([-1.224745, 0.0, 1.224745], rel=1e-5)]
    # [0, 1, 1, 0]: mean 0.5, std 0.5 -> [-1, 1, 1, -1]
    assert cls(GROUP).advantages([[0.0, 1.0, 1.0, 0.0]]) == [pytest.approx([-1, 1, 1, -1], rel=1e-5)]


def test_rloo_leave_one_out() -> None:
    # [1, 2, 3, 6]: 1 - (2+3+6)/3 = -2.666667; 2 - 10/3 = -1.333333; 3 - 9/3 = 0; 6 - 6/3 = 4
    assert RLOO(GROUP).advantages([[1.0, 2.0, 3.0, 6.0]]) == [pytest.approx([-8 / 3, -4 / 3, 0.0, 4.0], abs=1e-12)]


def test_dr_grpo_centred_only() -> None:
    # [1, 2, 3, 6]: mean 3 -> [-2, -1, 0, 3]
    assert DrGRPO(GROUP).advantages([[1.0, 2.0, 3.0, 6.0]]) == [[-2.0, -1.0, 0.0, 3.0]]


@pytest.mark.parametrize("cls", [ReinforcePP, GRPO, DrGRPO])
def test_batch_normalisation(cls: type) -> None:
    # groups [1, 3] and [0, 0, 6] centred: [-1, 1], [-2, -2, 4]; batch mean 0,
    # batch var (1 + 1 + 4 + 4 + 16) / 5 = 5.2, std 2.280351 -> divide.
    out = cls(BATCH).advantages([[1.0, 3.0], [0.0, 0.0, 6.0]])
    assert out[0] == pytest.approx([-0.438529, 0.438529], rel=1e-5)
    assert out[1] == pytest.approx([-0.877058, -0.877058, 1.754116], rel=1e-5)


def test_reinforce_pp_default_is_batch() -> None:
    assert ReinforcePP.capabilities.default_advantage_norm == "batch"
    assert ReinforcePP.capabilities.advantage_norms == ("batch",)


def test_single_sample_group_has_no_signal() -> None:
    assert RLOO(GROUP).advantages([[5.0]]) == [[0.0]]
    assert GRPO(GROUP).advantages([[5.0], [1.0, 3.0]])[0] == [0.0]


ALL_ALGORITHMS = (GRPO, RLOO, DrGRPO, ReinforcePP, CISPO, GSPO, SAPO)
# Equal rewards; for [0.7] * 3 and [0.1] * 3 the float mean is not exact (population std ~1e-16, not 0).
EQUAL_GROUPS = ([2.0, 2.0, 2.0], [0.7] * 3, [0.1] * 3, [0.0] * 4, [-3.3] * 5, [1.0, 1.0])


@pytest.mark.parametrize("cls", ALL_ALGORITHMS, ids=lambda c: c.name)
@pytest.mark.parametrize("rewards", EQUAL_GROUPS, ids=str)
def test_zero_variance_group_is_zero(cls: type[Algorithm], rewards: list[float]) -> None:
    """The algorithm's own group_advantages (not Algorithm.advantages, which zeroes such groups first)."""
    for norm in cls.capabilities.advantage_norms:
        adv = cls(AlgorithmConfig(advantage_norm=norm)).group_advantages(torch.tensor(rewards, dtype=torch.float64))
        assert adv.shape == (len(rewards),)
        assert bool(torch.isfinite(adv).all()), f"{cls.name} ({norm}) gave {adv.tolist()} for {rewards}"
        assert adv.abs().max().item() < 1e-9, f"{cls.name} ({norm}) gave {adv.tolist()} for {rewards}"


class _Garbage(GRPO):
    """Returns NaN for every group: Algorithm.advantages must not pass it on for groups without signal."""

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return torch.full_like(rewards, float("nan"))


def test_advantages_zeroes_groups_without_signal_before_the_algorithm() -> None:
    out = _Garbage(GROUP).advantages([[2.0, 2.0, 2.0], [7.0], [0.0, 1.0]])
    assert out[0] == [0.0, 0.0, 0.0] and out[1] == [0.0]
    assert all(math.isnan(x) for x in out[2])  # the group with signal does reach the algorithm


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-100, 100, allow_nan=False), min_size=2, max_size=12))
def test_rloo_property_reward_minus_mean_of_others(rewards: list[float]) -> None:
    out = RLOO(GROUP).advantages([rewards])[0]
    n = len(rewards)
    for i, r in enumerate(rewards):
        others = (sum(rewards) - r) / (n - 1)
        assert out[i] == pytest.approx(r - others, abs=1e-9 * (1 + max(abs(x) for x in rewards)))
