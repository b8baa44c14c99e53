"""The orchestrator's per-step metrics, computed from records (pure functions, no torch).

Names follow the metrics reference (docs "Metrics"):

- rewards: ``reward/{mean,std,min,max}``, ``reward/gini_mean`` (Gini of the rewards within
  each prompt group, averaged over groups); with several environments also
  ``reward/<env>/{mean,std,min,max}`` (the rewards scaled to the environments' declared
  ranges, ``reward/normalized/*``, are the batching's: :mod:`telescope.orchestrator.batching`).
- advantages: ``advantage/{mean,std,min,max}``.
- sample metrics: for every key of ``RewardResult.sample_metrics``,
  ``sample_metrics/<key>/{mean,std,min,max,gini_mean}``.
- tokens: ``tokens/{prompt,completion,total}/{mean,std,min,max}``; completion tokens are
  summed over turns; total is the whole sequence (environment turns included).
- ``stop_reason_length_pct``, ``group_length_gini_mean``, ``group_length_max_median_ratio_mean``.
- overlong penalty (``overlong_penalty_factor``), on steps where a rollout got one:
  ``reward/overlong_penalty/mean`` (over all rollouts, 0 for the unpenalised) and
  ``reward/overlong_penalty/count`` (rollouts penalised). ``reward/*`` are the
  environments' rewards, without the penalty.
- counts: ``rollouts/count``, ``groups/count``, ``rollouts/error_count``.
- discarded and canceled rollouts: see :func:`discard_metrics` and :class:`DiscardLog`.

Statistics are population statistics (``std`` with ddof=0). A statistic over no values is
left out rather than reported as NaN, so a chart shows a gap, not a fake zero.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from telescope.api.records import Group, Rollout

# ------------------------------------------------------------------ primitives


def gini(values: Iterable[float]) -> float:
    """Gini coefficient of ``values``: 0 when all are equal, towards 1 when one holds everything.

    Uses the population form ``G = sum_i sum_j |x_i - x_j| / (2 n^2 mean)``, computed on
    the sorted values as ``G = 2 sum_i i x_(i) / (n sum x) - (n + 1) / n`` (i from 1); its
    maximum for n values is ``(n - 1) / n`` (0.5 for a pair).

    Conventions, so that the result is always defined and in [0, 1):

    - fewer than two values, or all values equal (all zero included): 0.0;
    - non-finite values (NaN, inf) are ignored;
    - negative values: the values are shifted so that their minimum is 0 before computing
      (rewards in [-1, 1] then read like rewards in [0, 2]); the Gini of a shifted set
      measures the inequality above the lowest value, so ``[-1, -1, 1, 1]`` gives 0.5
      like ``[0, 0, 1, 1]``.
    """
    array = np.asarray([float(v) for v in values], dtype=np.float64)
    array = array[np.isfinite(array)]
    n = array.size
    if n < 2:
        return 0.0
    minimum = float(array.min())
    if minimum < 0.0:
        array = array - minimum
    total = float(array.sum())
    if total <= 0.0 or float(array.max()) == float(array.min()):
        return 0.0
    ranked = np.sort(array)
    index = np.arange(1, n + 1, dtype=np.float64)
    value = 2.0 * float(np.dot(index, ranked)) / (n * total) - (n + 1.0) / n
    return min(max(value, 0.0), 1.0)


def describe(values: Sequence[float], prefix: str) -> dict[str, float]:
    """``{prefix/mean, prefix/std, prefix/min, prefix/max}`` of the finite values; ``{}`` if none."""
    array = np.asarray(values, dtype=np.float64)
    array = array[np.isfinite(array)]
    if array.size == 0:
        return {}
    return {
        f"{prefix}/mean": float(array.mean()),
        f"{prefix}/std": float(array.std()),
        f"{prefix}/min": float(array.min()),
        f"{prefix}/max": float(array.max()),
    }


def _mean(values: Sequence[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _reward(rollout: Rollout) -> float | None:
    return rollout.reward.total_reward if rollout.reward is not None else None


# ------------------------------------------------------------------ step metrics


def rollout_step_metrics(groups: Sequence[Group], advantages: Sequence[float] = ()) -> dict[str, float]:
    """Every per-step metric of the rollouts in ``groups`` (the groups trained on this step).

    Rollouts without a reward (scoring failed) count in the token and stop-reason metrics
    but not in the reward and sample-metric ones. Per-environment reward statistics are reported
    only when the rollouts come from more than one environment.
    """
    rollouts = [rollout for group in groups for rollout in group.rollouts]
    metrics: dict[str, float] = {
        "rollouts/count": float(len(rollouts)),
        "groups/count": float(len(groups)),
        "rollouts/error_count": float(sum(1 for r in rollouts if r.error or (r.reward and r.reward.error))),
    }
    if not rollouts:
        return metrics

    rewards = [value for value in (_reward(r) for r in rollouts) if value is not None]
    metrics.update(describe(rewards, "reward"))
    group_reward_ginis = [
        gini(group_rewards)
        for group_rewards in ([v for v in (_reward(r) for r in g.rollouts) if v is not None] for g in groups)
        if group_rewards
    ]
    if group_reward_ginis:
        metrics["reward/gini_mean"] = float(np.mean(group_reward_ginis))
    metrics.update(_environment_reward_metrics(rollouts))

    metrics.update(describe(list(advantages), "advantage"))

    metrics.update(_sample_metric_metrics(groups))
    metrics.update(token_metrics(rollouts, "tokens"))

    length_stops = sum(1 for r in rollouts if r.finish_reason == "length")
    metrics["stop_reason_length_pct"] = 100.0 * length_stops / len(rollouts)
    penalties = [r.overlong_penalty for r in rollouts if r.overlong_penalty != 0.0]
    if penalties:
        metrics["reward/overlong_penalty/mean"] = float(np.mean([r.overlong_penalty for r in rollouts]))
        metrics["reward/overlong_penalty/count"] = float(len(penalties))

    length_ginis: list[float] = []
    max_median_ratios: list[float] = []
    for group in groups:
        lengths = [float(r.completion_length) for r in group.rollouts]
        if not lengths:
            continue
        length_ginis.append(gini(lengths))
        median = float(np.median(lengths))
        if median > 0:
            max_median_ratios.append(max(lengths) / median)
    if length_ginis:
        metrics["group_length_gini_mean"] = float(np.mean(length_ginis))
    if max_median_ratios:
        metrics["group_length_max_median_ratio_mean"] = float(np.mean(max_median_ratios))
    return metrics


def token_metrics(rollouts: Sequence[Rollout], prefix: str) -> dict[str, float]:
    """``<prefix>/{prompt,completion,total}/{mean,std,min,max}`` of ``rollouts``."""
    metrics: dict[str, float] = {}
    metrics.update(describe([float(r.prompt_length) for r in rollouts], f"{prefix}/prompt"))
    metrics.update(describe([float(r.completion_length) for r in rollouts], f"{prefix}/completion"))
    metrics.update(describe([float(len(r.token_ids)) for r in rollouts], f"{prefix}/total"))
    return metrics


def _environment_reward_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    by_environment: dict[str, list[float]] = defaultdict(list)
    for rollout in rollouts:
        value = _reward(rollout)
        if value is not None:
            by_environment[rollout.sample.environment].append(value)
    metrics: dict[str, float] = {}
    if len(by_environment) > 1:
        for environment, values in sorted(by_environment.items()):
            metrics.update(describe(values, f"reward/{environment or 'unknown'}"))
    return metrics


def _sample_metric_metrics(groups: Sequence[Group]) -> dict[str, float]:
    """``sample_metrics/<key>/{mean,std,min,max,gini_mean}`` for every key any rollout reported."""
    keys = sorted({key for g in groups for r in g.rollouts if r.reward for key in r.reward.sample_metrics})
    metrics: dict[str, float] = {}
    for key in keys:
        values: list[float] = []
        group_ginis: list[float] = []
        for group in groups:
            group_values = [
                float(r.reward.sample_metrics[key])
                for r in group.rollouts
                if r.reward is not None and key in r.reward.sample_metrics and _is_number(r.reward.sample_metrics[key])
            ]
            values.extend(group_values)
            if group_values:
                group_ginis.append(gini(group_values))
        metrics.update(describe(values, f"sample_metrics/{key}"))
        if group_ginis:
            metrics[f"sample_metrics/{key}/gini_mean"] = float(np.mean(group_ginis))
    return metrics


def _is_number(value: object) -> bool:
    if isinstance(value, bool):
        return True
    try:
        float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


# ------------------------------------------------------------------ discards


#: The output filters' reasons (:data:`telescope.orchestrator.filters.FILTER_REASONS`).
FILTER_REASONS = ("overlong", "gibberish", "repetition")


def discard_metrics(
    *,
    stale_rollouts: Sequence[Rollout] = (),
    zero_advantage_groups: Sequence[Group] = (),
    canceled: int = 0,
    trained_rollouts: int = 0,
    filtered_rollouts: Sequence[Rollout] = (),
) -> dict[str, float]:
    """Metrics of the rollouts not trained on this step, by reason.

    - ``discarded/max_async/count``: finished rollouts dropped because their weights were
      too many steps behind (``max_off_policy_steps``);
    - ``discarded/zero_advantage/count``: rollouts of groups whose rewards were all equal
      (``discard_group_zero_advantage``), with ``discarded/zero_advantage/groups`` and the
      breakdown in groups: ``.../all_zero`` (every reward 0), ``.../all_positive`` (every
      reward > 0) and ``.../mean_reward`` (mean reward of those rollouts);
    - ``discarded/canceled/count``: in-flight rollouts canceled before they finished;
    - ``discarded/{overlong,gibberish,repetition}/count``: rollouts of the batch whose loss
      an output filter masked (``Rollout.filtered``; one rollout may have several reasons),
      and ``discarded/filtered/count``: such rollouts, each once;
    - ``discarded/count`` (max_async, zero_advantage and filtered) and ``<reason>/pct`` and
      ``discarded/pct``: percentages of every rollout accounted for this step
      (``trained_rollouts + max_async + zero_advantage + filtered + canceled``, where
      ``trained_rollouts`` counts the batch's rollouts that were not filtered);
    - ``discarded/tokens/{prompt,completion,total}/{mean,std,min,max}``: token lengths of the
      discarded (not canceled) rollouts, when there are some.

    Counts are always reported (0 included) so that charts are continuous.
    """
    zero_advantage_rollouts = [r for g in zero_advantage_groups for r in g.rollouts]
    stale_count = len(stale_rollouts)
    zero_count = len(zero_advantage_rollouts)
    filtered_count = len(filtered_rollouts)
    total = trained_rollouts + stale_count + zero_count + filtered_count + canceled

    def pct(count: int) -> float:
        return 100.0 * count / total if total > 0 else 0.0

    metrics: dict[str, float] = {
        "discarded/max_async/count": float(stale_count),
        "discarded/max_async/pct": pct(stale_count),
        "discarded/zero_advantage/count": float(zero_count),
        "discarded/zero_advantage/pct": pct(zero_count),
        "discarded/zero_advantage/groups": float(len(zero_advantage_groups)),
        "discarded/zero_advantage/all_zero": float(
            sum(1 for g in zero_advantage_groups if g.rollouts and all(v == 0.0 for v in g.rewards))
        ),
        "discarded/zero_advantage/all_positive": float(
            sum(1 for g in zero_advantage_groups if g.rollouts and all(v > 0.0 for v in g.rewards))
        ),
        "discarded/canceled/count": float(canceled),
        "discarded/canceled/pct": pct(canceled),
        "discarded/filtered/count": float(filtered_count),
        "discarded/filtered/pct": pct(filtered_count),
        "discarded/count": float(stale_count + zero_count + filtered_count),
        "discarded/pct": pct(stale_count + zero_count + filtered_count),
    }
    for reason in FILTER_REASONS:
        count = sum(1 for r in filtered_rollouts if reason in r.filtered)
        metrics[f"discarded/{reason}/count"] = float(count)
        metrics[f"discarded/{reason}/pct"] = pct(count)
    zero_rewards = [v for v in (_reward(r) for r in zero_advantage_rollouts) if v is not None]
    mean_reward = _mean(zero_rewards)
    if mean_reward is not None:
        metrics["discarded/zero_advantage/mean_reward"] = mean_reward
    metrics.update(token_metrics([*stale_rollouts, *zero_advantage_rollouts, *filtered_rollouts], "discarded/tokens"))
    return metrics


@dataclass
class DiscardLog:
    """What the orchestrator dropped during one step; :meth:`pop_metrics` reports it and resets.

    The orchestrator calls :meth:`add_zero_advantage` for each group it drops for zero
    advantage, :meth:`add_stale` for finished rollouts it drops as too far off-policy,
    :meth:`add_canceled` for in-flight rollouts it cancels, :meth:`add_filtered` for the
    batch's rollouts an output filter masked, and :meth:`add_trained` for the other
    rollouts that go into the batch (with the others, the denominator of the percentages). It keeps
    the dropped records until the step's metrics are taken: a few groups per step.
    :attr:`dropped` lists every finished group or rollout dropped, with its reason, in order
    (the run store records them, see :func:`telescope.recording.run_store.discarded_records`);
    :meth:`add_dropped` adds those no metric counts here (errored rollouts, groups left with
    too few samples). Not thread-safe; fill it from the orchestrator's event loop.
    """

    stale_rollouts: list[Rollout] = field(default_factory=list)
    zero_advantage_groups: list[Group] = field(default_factory=list)
    canceled: int = 0
    trained_rollouts: int = 0
    filtered_rollouts: list[Rollout] = field(default_factory=list)
    dropped: list[tuple[str, list[Rollout]]] = field(default_factory=list)

    def add_zero_advantage(self, group: Group) -> None:
        self.zero_advantage_groups.append(group)
        self.dropped.append(("zero_advantage", list(group.rollouts)))

    def add_stale(self, rollouts: Iterable[Rollout]) -> None:
        """One group's finished rollouts, dropped as too far off-policy (``max_async``)."""
        group = list(rollouts)
        self.stale_rollouts.extend(group)
        self.dropped.append(("max_async", group))

    def add_dropped(self, reason: str, rollouts: Iterable[Rollout]) -> None:
        """Finished rollouts of one group dropped for ``reason`` without a discard metric of their own."""
        group = list(rollouts)
        if group:
            self.dropped.append((reason, group))

    def add_canceled(self, count: int = 1) -> None:
        if count < 0:
            raise ValueError(f"cannot add a negative number of canceled rollouts ({count})")
        self.canceled += count

    def add_filtered(self, rollouts: Iterable[Rollout]) -> None:
        """Rollouts of the batch whose loss an output filter masked (not counted as trained)."""
        self.filtered_rollouts.extend(rollouts)

    def add_trained(self, count: int) -> None:
        if count < 0:
            raise ValueError(f"cannot add a negative number of trained rollouts ({count})")
        self.trained_rollouts += count

    def metrics(self) -> dict[str, float]:
        """:func:`discard_metrics` of what was recorded (nothing is reset)."""
        return discard_metrics(
            stale_rollouts=self.stale_rollouts,
            zero_advantage_groups=self.zero_advantage_groups,
            canceled=self.canceled,
            trained_rollouts=self.trained_rollouts,
            filtered_rollouts=self.filtered_rollouts,
        )

    def reset(self) -> None:
        self.stale_rollouts = []
        self.zero_advantage_groups = []
        self.canceled = 0
        self.trained_rollouts = 0
        self.filtered_rollouts = []
        self.dropped = []

    def pop_metrics(self) -> dict[str, float]:
        """The step's discard metrics; the log is empty afterwards, ready for the next step."""
        metrics = self.metrics()
        self.reset()
        return metrics
