"""The LR schedule, by hand: warmup then constant / linear / cosine to min_lr_ratio."""

from __future__ import annotations

import pytest

from telescope.trainer.schedule import lr_factor


def test_none_ignores_warmup() -> None:
    assert [lr_factor(s, "none", 3, 10, 0.1) for s in range(3)] == [1.0, 1.0, 1.0]


def test_constant_with_warmup() -> None:
    # warmup 4: (s + 1) / 4
    assert [lr_factor(s, "constant", 4, 10, 0.0) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_linear_decay_to_min() -> None:
    # warmup 2, total 10 -> 8 decay steps; step 6: progress 4/8 -> 0.2 + 0.8 * 0.5 = 0.6
    assert lr_factor(6, "linear", 2, 10, 0.2) == pytest.approx(0.6)
    assert lr_factor(10, "linear", 2, 10, 0.2) == pytest.approx(0.2)
    assert lr_factor(50, "linear", 2, 10, 0.2) == pytest.approx(0.2)


def test_cosine() -> None:
    # no warmup, total 4, step 2: progress 1/2 -> 0.5 * (1 + cos(pi/2)) = 0.5 -> 0.1 + 0.9 * 0.5 = 0.55
    assert lr_factor(2, "cosine", 0, 4, 0.1) == pytest.approx(0.55)
    assert lr_factor(0, "cosine", 0, 4, 0.1) == pytest.approx(1.0)
