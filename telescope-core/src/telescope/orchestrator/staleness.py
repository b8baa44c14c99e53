"""Staleness per token: which work is too old to train, and what happens to it.

Every generated token carries the weights version that produced it
(``Turn.output_policy_versions``; the dispatch version where the server reports none, as
vLLM). A token trained at step ``t`` is *stale* when its version is below ``t -
max_off_policy_steps``. ``stale_token_policy`` says what a stale token costs:

- ``drop_episode`` (the default): its whole group is discarded as ``max_async`` (the
  oldest token of any rollout decides), and with ``first_finished`` also a group dispatched
  more than ``max_async_rollout`` versions before the step;
- ``mask``: its loss is masked at batching (:func:`mask_stale_tokens`, counted as
  ``policy/stale_tokens_masked``) and the rest of the episode trains; a group is discarded
  only when none of its generated tokens is fresh. The per-token bound replaces the dispatch
  bound, so a long episode may run while the trainer steps.

In flight: at a version move, groups dispatched before ``version - max_off_policy_steps``
are cancelled, unless ``continue_requests_across_updates``: then their requests go on with
the new weights (the embedded engine loads weights between two decoding steps and tags each
token with the version that produced it) and their stale tokens are masked instead.
Importance sampling needs nothing more: ``inference_logprobs`` holds each token's own
behaviour log-probability, whichever version produced it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from telescope.api.records import Group, Rollout, TrainingSample, Turn
from telescope.schema.config import TelescopeConfig

StaleTokenPolicy = Literal["drop_episode", "mask"]


@dataclass(frozen=True)
class Staleness:
    """The staleness bound and what the run does with stale work (see the module docstring)."""

    max_off_policy_steps: int = 8
    policy: StaleTokenPolicy = "drop_episode"
    continue_requests: bool = False

    @classmethod
    def from_config(cls, config: TelescopeConfig) -> Staleness:
        return cls(config.max_off_policy_steps, config.stale_token_policy, config.continue_requests_across_updates)

    def oldest_allowed(self, step: int) -> int:
        """The oldest version whose tokens step ``step`` trains."""
        return step - self.max_off_policy_steps

    def cancels(self, dispatch_version: int, version: int) -> bool:
        """Whether a group in flight since ``dispatch_version`` is cancelled when the version moves to ``version``."""
        return not self.continue_requests and dispatch_version < self.oldest_allowed(version)

    @property
    def bounds_dispatch(self) -> bool:
        """Whether ``first_finished`` also drops groups dispatched more than ``max_async_rollout`` versions ago."""
        return self.policy == "drop_episode"

    def too_stale(self, group: Group, step: int) -> bool:
        """Whether ``group`` is discarded rather than trained at ``step``."""
        oldest = self.oldest_allowed(step)
        if self.policy == "drop_episode":
            return min(r.oldest_policy_version for r in group.rollouts) < oldest
        return not any(v >= oldest for r in group.rollouts for v in generated_versions(r))


def generated_versions(rollout: Rollout) -> list[int]:
    """The version of every generated token of every sequence of the rollout."""
    return [v for turns in rollout.sequences for turn in turns for v in turn.token_versions]


def sequence_versions(turns: Sequence[Turn]) -> list[int]:
    """Per token of a sequence, its version (a token the model did not generate: its turn's dispatch version)."""
    out: list[int] = []
    for turn in turns:
        out.extend([turn.policy_version] * len(turn.input_token_ids))
        out.extend(turn.token_versions)
    return out


def mask_stale_tokens(
    samples: Sequence[TrainingSample], rollout: Rollout, oldest_allowed: int
) -> tuple[list[TrainingSample], int]:
    """The rollout's samples (one per ``rollout.sequences``) with stale tokens' loss masked; and how many were."""
    out: list[TrainingSample] = []
    masked = 0
    for sample, turns in zip(samples, rollout.sequences, strict=True):
        versions = sequence_versions(turns)
        mask = [keep and version >= oldest_allowed for keep, version in zip(sample.loss_mask, versions, strict=True)]
        dropped = sample.num_loss_tokens - sum(mask)
        masked += dropped
        out.append(replace(sample, loss_mask=mask) if dropped else sample)
    return out, masked


def policy_version_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """``policy/versions_per_episode`` and ``policy/tokens_per_version`` (generated tokens per episode and version).

    Both are means over the given (trained) rollouts: an episode generated under one version
    has 1 version, and its tokens per version are its generated tokens.
    """
    versions = [generated_versions(r) for r in rollouts]
    distinct = [len(set(v)) for v in versions if v]
    tokens = sum(len(v) for v in versions)
    return {
        "policy/versions_per_episode": sum(distinct) / max(len(distinct), 1),
        "policy/tokens_per_version": tokens / max(sum(distinct), 1),
    }
