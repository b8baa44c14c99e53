"""Where each metric goes on the Metrics page: its section and group.

The sections and their order follow the metrics reference (seeds 000/001): General
(the trainer's defaults: entropy, KL, grad norm, learning rate), Reward, Sample Metrics
(one group per reward component), Advantage, Evals (one group per eval), Rollouts
(token lengths, stop reason, group length Gini and max/median, off-policy steps),
Discarded Rollouts (by reason, zero-advantage split, canceled, discarded tokens) and
Timeline (full step, per microbatch, weight sync). Any other key follows the reference's
naming rule: no ``/`` -> General; ``section/metric``; ``section/group/metric...``.

:func:`classify` is pure and cheap; the server applies it to the distinct metric names of
the runs shown. :data:`REFERENCE_METRICS` lists the metrics the reference documents, with
their section, so a test can check every one has its place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GENERAL = "General"
REWARD = "Reward"
SAMPLE_METRICS = "Sample Metrics"
ADVANTAGE = "Advantage"
EVALS = "Evals"
ROLLOUTS = "Rollouts"
DISCARDED = "Discarded Rollouts"
TIMELINE = "Timeline"

#: The reference's sections first, in its order; other sections follow alphabetically.
SECTION_ORDER: tuple[str, ...] = (GENERAL, REWARD, SAMPLE_METRICS, ADVANTAGE, EVALS, ROLLOUTS, DISCARDED, TIMELINE)

_STATS = ("mean", "std", "min", "max")


@dataclass(frozen=True)
class Place:
    """A metric's section, group (``""`` for none) and short label."""

    section: str
    group: str
    label: str


def _title(text: str) -> str:
    return text.replace("_", " ").strip().capitalize() if text else text


_TOKENS = re.compile(r"^tokens/(prompt|completion|total)/(\w+)$")
_MICROBATCH = re.compile(r"^timing_(\w+)_microbatch_mean$")


def classify(name: str) -> Place:
    """The :class:`Place` of metric ``name`` (see the module docstring)."""
    parts = name.split("/")
    head = parts[0]
    if name.startswith("eval/") and len(parts) >= 3:
        return Place(EVALS, parts[1], "/".join(parts[2:]))
    if head == "reward":
        return Place(REWARD, "Normalized" if "normalized" in parts else "", "/".join(parts[1:]))
    if head == "sample_metrics" and len(parts) >= 3:
        return Place(SAMPLE_METRICS, parts[1], "/".join(parts[2:]))
    if head == "advantage":
        return Place(ADVANTAGE, "", "/".join(parts[1:]))
    match = _TOKENS.match(name)
    if match:
        return Place(ROLLOUTS, f"Tokens ({match[1].capitalize()})", match[2])
    if name in ("stop_reason_length_pct", "group_length_gini_mean", "group_length_max_median_ratio_mean"):
        return Place(ROLLOUTS, "Lengths", name)
    if name.startswith("policy/staleness/"):
        return Place(ROLLOUTS, "Off-policy steps", parts[-1])
    if head in ("rollouts", "groups"):
        return Place(ROLLOUTS, "Counts", name)
    if head == "discarded":
        return _discarded(parts)
    if name.startswith("timing_") or head == "timing":
        return _timing(name)
    if len(parts) == 1:
        return Place(GENERAL, "", name)
    if len(parts) == 2:
        return Place(_title(head), "", parts[1])
    return Place(_title(head), parts[1], "/".join(parts[2:]))


def _discarded(parts: list[str]) -> Place:
    rest = parts[1:]
    if not rest:
        return Place(DISCARDED, "", "discarded")
    if rest[0] == "tokens" and len(rest) >= 3:
        return Place(DISCARDED, f"Discarded tokens ({rest[1].capitalize()})", "/".join(rest[2:]))
    if rest[0] == "zero_advantage":
        return Place(DISCARDED, "Zero advantage", "/".join(rest[1:]))
    if rest[0] == "canceled":
        return Place(DISCARDED, "Canceled", "/".join(rest[1:]))
    if len(rest) == 1:
        return Place(DISCARDED, "All reasons", rest[0])
    return Place(DISCARDED, f"Reason: {rest[0]}", "/".join(rest[1:]))


def _timing(name: str) -> Place:
    if name.startswith("timing/"):
        parts = name.split("/")
        return Place(TIMELINE, parts[1] if len(parts) > 2 else "", parts[-1])
    match = _MICROBATCH.match(name)
    if match:
        return Place(TIMELINE, "Per microbatch (mean)", match[1])
    short = name[len("timing_") :]
    if "weight_sync" in short:
        return Place(TIMELINE, "Weight sync", short)
    return Place(TIMELINE, "Full step", short)


def section_rank(section: str) -> tuple[int, str]:
    """Sort key: the reference's sections in order, then the others alphabetically."""
    try:
        return (SECTION_ORDER.index(section), "")
    except ValueError:
        return (len(SECTION_ORDER), section.lower())


#: Every metric the metrics reference names, with the section it documents it in.
REFERENCE_METRICS: dict[str, str] = {
    "entropy": GENERAL,
    "kl_divergence_inference": GENERAL,
    "grad_norm": GENERAL,
    "learning_rate": GENERAL,
    **{f"reward/{stat}": REWARD for stat in _STATS},
    "reward/gini_mean": REWARD,
    **{f"sample_metrics/correct/{stat}": SAMPLE_METRICS for stat in (*_STATS, "gini_mean")},
    **{f"advantage/{stat}": ADVANTAGE for stat in _STATS},
    **{f"tokens/{kind}/{stat}": ROLLOUTS for kind in ("prompt", "completion", "total") for stat in _STATS},
    "stop_reason_length_pct": ROLLOUTS,
    "group_length_gini_mean": ROLLOUTS,
    "group_length_max_median_ratio_mean": ROLLOUTS,
    "discarded/count": DISCARDED,
    "discarded/pct": DISCARDED,
    "discarded/max_async/count": DISCARDED,
    "discarded/max_async/pct": DISCARDED,
    "discarded/zero_advantage/count": DISCARDED,
    "discarded/zero_advantage/pct": DISCARDED,
    "discarded/zero_advantage/all_zero": DISCARDED,
    "discarded/zero_advantage/all_positive": DISCARDED,
    "discarded/zero_advantage/mean_reward": DISCARDED,
    "discarded/canceled/count": DISCARDED,
    **{f"discarded/tokens/{kind}/mean": DISCARDED for kind in ("prompt", "completion", "total")},
    **{
        name: TIMELINE
        for name in (
            "timing_step_total",
            "timing_step_active",
            "timing_forward_total",
            "timing_backward_total",
            "timing_loss_computation_total",
            "timing_compute_kl_total",
            "timing_compute_entropy_total",
            "timing_data_to_device_total",
            "timing_prepare_tensors_total",
            "timing_waiting_for_data",
            "timing_weight_sync_trainer_total",
            "timing_weight_sync_inference_total",
            "timing_forward_microbatch_mean",
            "timing_backward_microbatch_mean",
        )
    },
    "custom/my_metric": "Custom",
    "debug/grads/layer_norm": "Debug",
    "eval/math500/accuracy": EVALS,
}
