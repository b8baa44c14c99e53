"""The streak of groups whose every rollout errored: a mixed group ends it, the bound stops the run."""

from __future__ import annotations

from telescope.api.records import Rollout, Sample
from telescope.orchestrator.group_streaks import AllRolloutsErrored, ErroredGroupStreak


def group(*errors: str | None) -> list[Rollout]:
    sample = Sample(prompt="p", answer=None, sample_id="s1", environment="env")
    return [Rollout(sample=sample, turns=[], error=error) for error in errors]


def test_the_bound_counts_groups_in_a_row_and_a_mixed_group_resets_it() -> None:
    streak = ErroredGroupStreak(max_batches=2, batch_size=2)  # 4 groups in a row
    for _ in range(3):
        assert streak.observe("env", group("boom", "boom")) is None
    assert streak.observe("env", group("boom", None)) is None  # one rollout scored: the streak ends
    assert streak.count == 0
    for _ in range(3):
        assert streak.observe("env", group("boom", "boom")) is None
    stopped = streak.observe("env", group("ValueError in compute_reward: last [raised at x.py:3 in f]", "boom"))
    assert isinstance(stopped, AllRolloutsErrored)
    assert "the last 4 groups" in str(stopped)
    assert "environment 'env': ValueError in compute_reward: last [raised at x.py:3 in f]" in str(stopped)


def test_zero_never_stops() -> None:
    streak = ErroredGroupStreak(max_batches=0, batch_size=2)
    assert all(streak.observe("env", group("boom", "boom")) is None for _ in range(100))
