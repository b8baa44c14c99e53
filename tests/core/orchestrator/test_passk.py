"""pass@k / pass^k against hand-computed binomial ratios."""

from __future__ import annotations

import itertools
import random

import pytest

from telescope.orchestrator.evals import pass_at_k, pass_hat_k, pass_k_metrics


def test_golden_values() -> None:
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # pass^2 = C(2,2)/C(5,2) = 1/10
    assert pass_hat_k(5, 2, 2) == pytest.approx(0.1)
    # k=1 is the fraction correct: 3/8
    assert pass_at_k(8, 3, 1) == pytest.approx(0.375)
    assert pass_hat_k(8, 3, 1) == pytest.approx(0.375)
    # n=10, c=3, k=4: 1 - C(7,4)/C(10,4) = 1 - 35/210 = 5/6; pass^4 = C(3,4)/.. = 0
    assert pass_at_k(10, 3, 4) == pytest.approx(5 / 6)
    assert pass_hat_k(10, 3, 4) == 0.0
    # n=4, c=3, k=2: 1 - C(1,2)/C(4,2) = 1 (any two contain a correct one); pass^2 = 3/6
    assert pass_at_k(4, 3, 2) == 1.0
    assert pass_hat_k(4, 3, 2) == pytest.approx(0.5)


def test_edges() -> None:
    assert pass_at_k(4, 0, 4) == 0.0 and pass_hat_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 4) == 1.0 and pass_hat_k(4, 4, 4) == 1.0
    # large n: exact integers, no overflow (C(1000, 500) has ~300 digits)
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5)
    assert 0.0 < pass_hat_k(1000, 999, 500) == pytest.approx(0.5)


def test_matches_enumeration_of_subsets() -> None:
    rng = random.Random(0)
    for _ in range(20):
        n = rng.randint(1, 8)
        c = rng.randint(0, n)
        k = rng.randint(1, n)
        outcomes = [True] * c + [False] * (n - c)
        subsets = list(itertools.combinations(outcomes, k))
        assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
        assert pass_hat_k(n, c, k) == pytest.approx(sum(all(s) for s in subsets) / len(subsets))


def test_validation() -> None:
    with pytest.raises(ValueError, match="at least k=4"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="between 0 and n"):
        pass_hat_k(3, 4, 1)
    with pytest.raises(ValueError, match="at least 1"):
        pass_at_k(3, 1, 0)
    with pytest.raises(ValueError, match="one problem"):
        pass_k_metrics([], 4, [1])
    with pytest.raises(ValueError, match="one k"):
        pass_k_metrics([1], 4, [])
    with pytest.raises(ValueError, match="one per problem"):
        pass_k_metrics([1, 2], [4], [1])


def test_pass_k_metrics_averages_problems() -> None:
    # problems with n=4 and c = 0, 2, 4
    # pass@1: (0 + 1/2 + 1)/3 = 0.5; pass@2: (0 + (1 - C(2,2)/C(4,2)) + 1)/3 = (0 + 5/6 + 1)/3 = 11/18
    # pass^2: (0 + C(2,2)/C(4,2) + 1)/3 = (1/6 + 1)/3 = 7/18
    m = pass_k_metrics([0, 2, 4], 4, [2, 1, 2])
    assert list(m) == ["pass@1", "pass^1", "pass@2", "pass^2"]
    assert m["pass@1"] == pytest.approx(0.5) and m["pass^1"] == pytest.approx(0.5)
    assert m["pass@2"] == pytest.approx(11 / 18)
    assert m["pass^2"] == pytest.approx(7 / 18)
    # per-problem sample counts
    mixed = pass_k_metrics([1, 2], [2, 5], [2])
    assert mixed["pass@2"] == pytest.approx((1.0 + 0.7) / 2)
