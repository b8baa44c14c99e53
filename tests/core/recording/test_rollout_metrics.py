"""Per-step orchestrator metrics against values computed by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest

from telescope.api.records import FinishReason, Group, RewardResult, Rollout, Sample, Turn
from telescope.orchestrator.batching import normalize_reward, normalized_reward_metrics, scored
from telescope.recording.rollout_metrics import (
    DiscardLog,
    describe,
    discard_metrics,
    gini,
    rollout_step_metrics,
)


def rollout(
    reward: float | None,
    *,
    completion: int,
    prompt: int = 3,
    environment: str = "countdown",
    finish: FinishReason = "stop",
    sample_metrics: dict[str, float] | None = None,
) -> Rollout:
    turn = Turn(
        input_token_ids=[1] * prompt,
        output_token_ids=[2] * completion,
        output_logprobs=[-0.5] * completion,
        policy_version=0,
        finish_reason=finish,
    )
    return Rollout(
        sample=Sample(prompt="p", environment=environment),
        turns=[turn],
        reward=None if reward is None else RewardResult(total_reward=reward, sample_metrics=sample_metrics or {}),
    )


def group(rollouts: list[Rollout]) -> Group:
    return Group(sample=rollouts[0].sample, rollouts=rollouts)


# ------------------------------------------------------------------ gini


def test_gini_hand_computed() -> None:
    # [0,0,1,1]: sum over ordered pairs |xi-xj| = 2*2*2*1 = 8; 2 n^2 mean = 2*16*0.5 = 16 -> 0.5
    assert gini([0, 0, 1, 1]) == pytest.approx(0.5)
    # [1,1,1,5]: 3 pairs (1,5) both orders = 6 * 4 = 24; 2*16*2 = 64 -> 0.375
    assert gini([1, 1, 1, 5]) == pytest.approx(0.375)
    # [0,0,0,1]: the maximum for n=4, (n-1)/n = 0.75
    assert gini([0, 0, 0, 1]) == pytest.approx(0.75)
    # order does not matter
    assert gini([5, 1, 1, 1]) == pytest.approx(0.375)


def test_gini_conventions() -> None:
    assert gini([]) == 0.0
    assert gini([3.0]) == 0.0
    assert gini([0, 0, 0]) == 0.0  # all zero: all equal
    assert gini([2, 2, 2]) == 0.0
    assert gini([-1, -1, 1, 1]) == pytest.approx(0.5)  # shifted to [0,0,2,2]
    assert gini([-3, -3]) == 0.0
    assert gini([0, 0, 1, 1, float("nan")]) == pytest.approx(0.5)  # non-finite ignored


def test_describe_and_normalize_reward() -> None:
    assert describe([], "x") == {}
    stats = describe([1.0, 3.0], "x")
    assert stats == {"x/mean": 2.0, "x/std": 1.0, "x/min": 1.0, "x/max": 3.0}
    assert normalize_reward(1.5, 0.0, 2.0) == 0.75
    assert normalize_reward(3.0, 0.0, 2.0) == 1.0  # clamped
    assert normalize_reward(-1.0, 0.0, 2.0) == 0.0
    assert normalize_reward(5.0, None, 2.0) == 5.0  # identity without both bounds
    assert normalize_reward(5.0, 0.0, None) == 5.0
    with pytest.raises(ValueError, match="greater than"):
        normalize_reward(1.0, 2.0, 2.0)


# ------------------------------------------------------------------ step metrics


def two_groups() -> list[Group]:
    group_a = group(
        [
            rollout(0.0, completion=2, sample_metrics={"correct": 0.0, "steps": 1.0}),
            rollout(0.0, completion=4, sample_metrics={"correct": 0.0, "steps": 1.0}),
            rollout(1.0, completion=6, sample_metrics={"correct": 1.0, "steps": 1.0}),
            rollout(1.0, completion=8, finish="length", sample_metrics={"correct": 1.0, "steps": 5.0}),
        ]
    )
    group_b = group(
        [
            rollout(2.0, completion=10, prompt=5, environment="math", sample_metrics={"correct": 1.0}),
            rollout(2.0, completion=10, prompt=5, environment="math", sample_metrics={"correct": 1.0}),
        ]
    )
    return [group_a, group_b]


def test_rollout_step_metrics_hand_computed() -> None:
    advantages = [-1.0, -1.0, 1.0, 1.0, 0.0, 0.0]  # from the training batch
    ranges = {"countdown": (0.0, 1.0), "math": (0.0, 4.0)}
    m = rollout_step_metrics(two_groups(), advantages)
    m.update(normalized_reward_metrics([scored(g, ranges) for g in two_groups()], ranges))
    assert m["rollouts/count"] == 6 and m["groups/count"] == 2 and m["rollouts/error_count"] == 0
    # rewards [0,0,1,1,2,2]: mean 1, variance (1+1+0+0+1+1)/6 = 2/3
    assert m["reward/mean"] == pytest.approx(1.0)
    assert m["reward/std"] == pytest.approx(math.sqrt(2 / 3))
    assert (m["reward/min"], m["reward/max"]) == (0.0, 2.0)
    # group Ginis: [0,0,1,1] -> 0.5, [2,2] -> 0; mean 0.25
    assert m["reward/gini_mean"] == pytest.approx(0.25)
    # two environments: per-environment stats
    assert m["reward/countdown/mean"] == pytest.approx(0.5) and m["reward/countdown/std"] == pytest.approx(0.5)
    assert m["reward/math/mean"] == pytest.approx(2.0) and m["reward/math/std"] == 0.0
    # normalised: countdown [0,0,1,1] / 1 -> mean 0.5; math [2,2] / 4 -> 0.5
    assert m["reward/countdown/normalized_mean"] == pytest.approx(0.5)
    assert m["reward/math/normalized_mean"] == pytest.approx(0.5)
    assert m["reward/normalized/mean"] == pytest.approx(0.5)
    # advantages [-1,-1,1,1,0,0]: mean 0, variance 4/6
    assert m["advantage/mean"] == pytest.approx(0.0)
    assert m["advantage/std"] == pytest.approx(math.sqrt(2 / 3))
    assert (m["advantage/min"], m["advantage/max"]) == (-1.0, 1.0)
    # sample metric "correct": [0,0,1,1,1,1] mean 2/3; Ginis 0.5 and 0 -> 0.25
    assert m["sample_metrics/correct/mean"] == pytest.approx(2 / 3)
    assert m["sample_metrics/correct/gini_mean"] == pytest.approx(0.25)
    # "steps" only in group A: [1,1,1,5] mean 2, variance (1+1+1+9)/4 = 3, Gini 0.375
    assert m["sample_metrics/steps/mean"] == pytest.approx(2.0)
    assert m["sample_metrics/steps/std"] == pytest.approx(math.sqrt(3))
    assert (m["sample_metrics/steps/min"], m["sample_metrics/steps/max"]) == (1.0, 5.0)
    assert m["sample_metrics/steps/gini_mean"] == pytest.approx(0.375)
    # tokens: prompt [3,3,3,3,5,5], completion [2,4,6,8,10,10], total = prompt + completion (one turn)
    assert m["tokens/prompt/mean"] == pytest.approx(22 / 6)
    assert m["tokens/completion/mean"] == pytest.approx(40 / 6)
    assert (m["tokens/completion/min"], m["tokens/completion/max"]) == (2.0, 10.0)
    assert m["tokens/total/mean"] == pytest.approx(62 / 6)
    assert m["tokens/total/max"] == 15.0
    assert m["stop_reason_length_pct"] == pytest.approx(100 / 6)
    # length Gini: [2,4,6,8]: 2*(1*2+2*4+3*6+4*8)/(4*20) - 5/4 = 1.5 - 1.25 = 0.25; [10,10] -> 0
    assert m["group_length_gini_mean"] == pytest.approx(0.125)
    # max/median: 8/5 = 1.6 and 10/10 = 1 -> 1.3
    assert m["group_length_max_median_ratio_mean"] == pytest.approx(1.3)


def test_single_environment_has_no_per_environment_keys() -> None:
    m = rollout_step_metrics([two_groups()[0]])
    assert not any(key.startswith("reward/countdown") for key in m)
    assert "reward/normalized/mean" not in m  # the batching's (normalized_reward_metrics)
    assert m["reward/gini_mean"] == pytest.approx(0.5)


def test_missing_rewards_multi_turn_and_empty() -> None:
    multi_turn = Rollout(
        sample=Sample(prompt="p"),
        turns=[
            Turn(input_token_ids=[1, 1], output_token_ids=[2, 2, 2], output_logprobs=[0.0] * 3, policy_version=0),
            Turn(input_token_ids=[3], output_token_ids=[4], output_logprobs=[0.0], policy_version=1),
        ],
        reward=RewardResult(total_reward=1.0, error=None),
    )
    failed = dataclasses.replace(rollout(None, completion=0), error="timeout")
    m = rollout_step_metrics([group([multi_turn, failed])])
    assert m["rollouts/error_count"] == 1
    assert m["reward/mean"] == 1.0 and m["reward/std"] == 0.0  # the unscored rollout is not a 0 reward
    # completion summed over turns: 3 + 1 = 4; total = 2 + 3 + 1 + 1 = 7
    assert m["tokens/completion/max"] == 4.0 and m["tokens/total/max"] == 7.0
    # lengths [4, 0]: median 2, max 4 -> 2.0
    assert m["group_length_max_median_ratio_mean"] == pytest.approx(2.0)
    assert "advantage/mean" not in m  # no advantages: no NaN keys
    assert rollout_step_metrics([]) == {"rollouts/count": 0.0, "groups/count": 0.0, "rollouts/error_count": 0.0}


# ------------------------------------------------------------------ discards


def test_discard_metrics_hand_computed() -> None:
    stale = [rollout(1.0, completion=2), rollout(0.0, completion=4)]
    all_zero = group([rollout(0.0, completion=6), rollout(0.0, completion=6)])
    all_one = group([rollout(1.0, completion=8), rollout(1.0, completion=8)])
    m = discard_metrics(stale_rollouts=stale, zero_advantage_groups=[all_zero, all_one], canceled=3, trained_rollouts=6)
    # accounted: 6 trained + 2 stale + 4 zero-advantage + 3 canceled = 15
    assert m["discarded/max_async/count"] == 2 and m["discarded/max_async/pct"] == pytest.approx(200 / 15)
    assert m["discarded/zero_advantage/count"] == 4 and m["discarded/zero_advantage/pct"] == pytest.approx(400 / 15)
    assert m["discarded/zero_advantage/groups"] == 2
    assert m["discarded/zero_advantage/all_zero"] == 1 and m["discarded/zero_advantage/all_positive"] == 1
    assert m["discarded/zero_advantage/mean_reward"] == pytest.approx(0.5)
    assert m["discarded/canceled/count"] == 3 and m["discarded/canceled/pct"] == pytest.approx(20.0)
    assert m["discarded/count"] == 6 and m["discarded/pct"] == pytest.approx(40.0)
    # discarded completion lengths [2,4,6,6,8,8]: mean 34/6
    assert m["discarded/tokens/completion/mean"] == pytest.approx(34 / 6)
    assert (m["discarded/tokens/completion/min"], m["discarded/tokens/completion/max"]) == (2.0, 8.0)
    assert m["discarded/tokens/prompt/mean"] == 3.0


def test_discard_log_accumulates_and_resets() -> None:
    log = DiscardLog()
    empty = log.metrics()
    assert empty["discarded/count"] == 0 and empty["discarded/pct"] == 0.0
    assert "discarded/tokens/completion/mean" not in empty
    log.add_stale([rollout(1.0, completion=2)])
    log.add_zero_advantage(group([rollout(0.0, completion=4), rollout(0.0, completion=4)]))
    log.add_canceled()
    log.add_canceled(2)
    log.add_trained(4)
    m = log.pop_metrics()
    assert m == discard_metrics(
        stale_rollouts=[rollout(1.0, completion=2)],
        zero_advantage_groups=[group([rollout(0.0, completion=4), rollout(0.0, completion=4)])],
        canceled=3,
        trained_rollouts=4,
    )
    # 4 trained + 1 stale + 2 zero + 3 canceled = 10
    assert m["discarded/canceled/pct"] == pytest.approx(30.0)
    assert m["discarded/zero_advantage/all_zero"] == 1 and m["discarded/zero_advantage/all_positive"] == 0
    assert log.metrics() == empty
    with pytest.raises(ValueError):
        log.add_canceled(-1)
