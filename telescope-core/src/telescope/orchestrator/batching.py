"""From accepted groups to a training batch: reward scaling, then advantages, then samples.

Per environment, rewards are first mapped to [0, 1] when the environment entry
declares ``reward_min``/``reward_max`` (so environments with different reward
scales weigh alike), each rollout's overlong penalty is added (0 unless
``overlong_penalty_factor`` is set), then the algorithm turns each group's rewards into
advantages (:meth:`telescope.api.algorithm.Algorithm.advantages`, which also
applies ``advantage_norm: batch`` across the batch). Each token sequence of a rollout
(its main one and its ``segments``) becomes one
:class:`~telescope.api.records.TrainingSample` carrying the rollout's advantage; the
rollout records themselves are left as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from telescope.api.algorithm import Algorithm
from telescope.api.records import Group, TrainingBatch, TrainingSample
from telescope.recording.rollout_metrics import normalize_reward

#: ``{environment: (reward_min, reward_max)}``; a bound may be None (not declared).
RewardRanges = Mapping[str, tuple[float | None, float | None]]


def scaled_rewards(group: Group, reward_ranges: RewardRanges) -> list[float]:
    """The group's rewards, scaled to [0, 1] by its environment's declared range (as is otherwise)."""
    low, high = reward_ranges.get(group.sample.environment, (None, None))
    return [normalize_reward(r.reward.total_reward if r.reward else 0.0, low, high) for r in group.rollouts]


def training_rewards(group: Group, reward_ranges: RewardRanges) -> list[float]:
    """What the algorithm sees: the scaled rewards plus each rollout's overlong penalty.

    The penalty (``overlong_penalty_factor``, :mod:`telescope.orchestrator.filters`) is
    added after the scaling, so that it is not clamped away at the range's lower end:
    with a declared range it is in units of the [0, 1] reward.
    """
    return [
        r + rollout.overlong_penalty
        for r, rollout in zip(scaled_rewards(group, reward_ranges), group.rollouts, strict=True)
    ]


def build_training_batch(
    step: int, groups: Sequence[Group], algorithm: Algorithm, reward_ranges: RewardRanges
) -> TrainingBatch:
    """The training batch of ``step``: one sample per rollout's sequence, with the rollout's advantage.

    A filtered rollout (``Rollout.filtered``) gets its advantage like the others but an
    all-false loss mask (:meth:`TrainingSample.from_rollout`).
    """
    advantages = algorithm.advantages([training_rewards(g, reward_ranges) for g in groups])
    samples = [
        sample
        for group_index, (group, group_advantages) in enumerate(zip(groups, advantages, strict=True))
        for rollout_index, (rollout, advantage) in enumerate(zip(group.rollouts, group_advantages, strict=True))
        for sample in TrainingSample.all_from_rollout(rollout, advantage, group_index, rollout_index)
    ]
    return TrainingBatch(samples=samples, step=step, policy_version=step)
