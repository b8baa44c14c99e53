"""An episode that trains as several token sequences (``Rollout.segments``): one sample each, one advantage.

The group, and so the advantage, is over episodes: an episode with three sequences weighs in
the advantage like one with one; each of its sequences carries that advantage, its own
tokens, mask, log-probabilities and oldest policy version.
"""

from __future__ import annotations

import pytest

from telescope.algorithms.grpo import GRPO
from telescope.api.algorithm import AlgorithmConfig
from telescope.api.records import Group, RewardResult, Rollout, Sample, TrainingSample, Turn
from telescope.orchestrator.batching import build_training_batch

SAMPLE = Sample("p", sample_id="s", environment="e")


def turn(prompt: list[int], output: list[int], version: int) -> Turn:
    return Turn(prompt, output, [-0.5] * len(output), version)


def test_each_sequence_of_an_episode_is_a_sample_with_the_episodes_advantage() -> None:
    segmented = Rollout(
        SAMPLE,
        [turn([1, 2], [7, 8], 3)],
        reward=RewardResult(1.0),
        segments=[[turn([1], [5], 1)], [turn([1, 9], [6, 6, 6], 2), turn([4], [3], 2)]],
    )
    plain = Rollout(SAMPLE, [turn([1], [5, 5], 3)], reward=RewardResult(0.0))
    algorithm = GRPO(AlgorithmConfig(advantage_norm="group"))
    batch = build_training_batch(4, [Group(SAMPLE, [segmented, plain])], algorithm, {})

    advantages = algorithm.advantages([[1.0, 0.0]])[0]  # two episodes, not four sequences
    assert [(s.rollout_index, s.segment_index) for s in batch.samples] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert [s.advantage for s in batch.samples] == pytest.approx([advantages[0]] * 3 + [advantages[1]])
    first, second, main, other = batch.samples
    assert first.token_ids == [1, 5] and first.loss_mask == [False, True] and first.policy_version == 1
    assert second.token_ids == [1, 9, 6, 6, 6, 4, 3]
    assert second.loss_mask == [False, False, True, True, True, False, True]
    assert second.inference_logprobs == [0.0, 0.0, -0.5, -0.5, -0.5, 0.0, -0.5]
    assert main.token_ids == [1, 2, 7, 8] and main.policy_version == 3
    assert other.token_ids == [1, 5, 5]
    assert batch.num_loss_tokens == 1 + 4 + 2 + 2


def test_staleness_counts_every_sequence_and_filtering_masks_them_all() -> None:
    segmented = Rollout(
        SAMPLE, [turn([1], [2], 5)], segments=[[turn([1], [2], 2)]], filtered=("overlong",), reward=RewardResult(1.0)
    )
    assert segmented.oldest_policy_version == 2  # the old segment's tokens, not only the main sequence's
    samples = TrainingSample.all_from_rollout(segmented, 0.5)
    assert [s.loss_mask for s in samples] == [[False, False], [False, False]]
    assert TrainingSample.from_rollout(segmented, 0.5).segment_index == 1


def test_a_scored_group_carries_its_scaled_rewards_and_everything_reads_them() -> None:
    """Scaled once when the group is scored: the advantages and the normalized metrics use the carried values."""
    from telescope.orchestrator.batching import normalized_reward_metrics, scored, training_rewards

    rollouts = [Rollout(SAMPLE, [turn([1], [2], 0)], reward=RewardResult(v)) for v in (0.0, 2.0)]
    group = scored(Group(SAMPLE, rollouts), {"e": (0.0, 4.0)})
    assert group.scaled_rewards == [0.0, 0.5]
    carried = Group(SAMPLE, rollouts, scaled_rewards=[1.0, 0.0])  # not what scaling would give
    assert training_rewards(carried, {"e": (0.0, 4.0)}) == [1.0, 0.0]
    algorithm = GRPO(AlgorithmConfig(advantage_norm="group"))
    batch = build_training_batch(0, [carried], algorithm, {"e": (0.0, 4.0)})
    assert batch.samples[0].advantage > 0 > batch.samples[1].advantage  # the carried order, not the rewards'
    assert normalized_reward_metrics([carried], {}) == {"reward/normalized/mean": 0.5}
