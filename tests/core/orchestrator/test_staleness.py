"""Staleness per token: stale tokens masked or the episode dropped, requests continued across updates, metrics.

Hand-made rollouts whose tokens span several weights versions (as the embedded engine
reports them when a request runs across a weight update), the batching that masks, the
scheduler's choice between cancelling and continuing, and the step's version metrics.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from telescope.algorithms.grpo import GRPO
from telescope.api.algorithm import AlgorithmConfig
from telescope.api.records import Group, RewardResult, Rollout, Sample, Turn
from telescope.inference.generation import Generation
from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.batching import build_training_batch
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.staleness import (
    Staleness,
    generated_versions,
    mask_stale_tokens,
    policy_version_metrics,
)

from .test_batch_assembly import LongTailed, make_scheduler

SAMPLE = Sample(prompt="p", sample_id="0")


def turn(inputs: int, versions: list[int], logprobs: list[float] | None = None) -> Turn:
    ids = list(range(10, 10 + len(versions)))
    lps = logprobs if logprobs is not None else [-0.5] * len(versions)
    return Turn(list(range(3, 3 + inputs)), ids, lps, policy_version=versions[0], output_policy_versions=versions)


def episode(reward: float, segment_versions: list[int], main_versions: list[int]) -> Rollout:
    """A compacted episode: one closed segment and the main sequence, each one turn of 2 prompt tokens."""
    return Rollout(
        sample=SAMPLE,
        turns=[turn(2, main_versions)],
        segments=[[turn(2, segment_versions)]],
        reward=RewardResult(total_reward=reward),
    )


def test_stale_tokens_are_masked_and_counted_per_sequence() -> None:
    rollout = episode(1.0, segment_versions=[0, 0, 1], main_versions=[1, 2, 2])
    from telescope.api.records import TrainingSample

    samples, masked = mask_stale_tokens(TrainingSample.all_from_rollout(rollout, 1.0), rollout, oldest_allowed=1)
    assert masked == 2
    assert samples[0].loss_mask == [False, False, False, False, True]  # prompt, two tokens of version 0, one fresh
    assert samples[1].loss_mask == [False, False, True, True, True]


def test_the_batch_masks_stale_tokens_and_reports_how_many() -> None:
    groups = [Group(SAMPLE, [episode(1.0, [0, 0, 1], [1, 2, 2]), episode(0.0, [2, 2], [2])])]
    algorithm = GRPO(AlgorithmConfig(advantage_norm="group"))
    batch = build_training_batch(3, groups, algorithm, {}, oldest_allowed=1)
    assert batch.metadata["stale_tokens_masked"] == 2
    assert [s.num_loss_tokens for s in batch.samples] == [1, 3, 2, 1]
    unmasked = build_training_batch(3, groups, algorithm, {})
    assert [s.num_loss_tokens for s in unmasked.samples] == [3, 3, 2, 1]
    assert unmasked.metadata["stale_tokens_masked"] == 0


def test_importance_sampling_sees_each_tokens_own_behaviour_logprob() -> None:
    """A turn generated across an update: each token keeps the log-probability of the weights that produced it."""
    from telescope.api.records import TrainingSample

    across = turn(2, [4, 4, 5, 5], logprobs=[-0.1, -0.2, -1.5, -1.6])
    rollout = Rollout(sample=SAMPLE, turns=[across], reward=RewardResult(total_reward=1.0))
    (sample,) = TrainingSample.all_from_rollout(rollout, 1.0)
    assert sample.inference_logprobs == [0.0, 0.0, -0.1, -0.2, -1.5, -1.6]


def test_the_policy_decides_between_dropping_and_masking() -> None:
    group = Group(SAMPLE, [episode(1.0, [0, 0], [0, 3]), episode(0.0, [3], [3])])
    all_stale = Group(SAMPLE, [episode(1.0, [0], [0]), episode(0.0, [1], [1])])
    drop, mask = Staleness(2, "drop_episode"), Staleness(2, "mask", continue_requests=True)
    assert drop.too_stale(group, step=3) and not mask.too_stale(group, step=3)  # oldest 0 < 3 - 2; 3 is fresh
    assert drop.too_stale(all_stale, step=4) and mask.too_stale(all_stale, step=4)  # 0 and 1 < 4 - 2
    assert not drop.too_stale(group, step=2)
    assert drop.cancels(dispatch_version=0, version=3) and not mask.cancels(dispatch_version=0, version=3)
    assert not drop.cancels(dispatch_version=1, version=3)
    assert drop.bounds_dispatch and not mask.bounds_dispatch


def test_versions_per_episode_and_tokens_per_version_by_hand() -> None:
    # episode 1: versions {0, 1, 2} over 6 tokens; episode 2: {2} over 3 tokens
    rollouts = [episode(1.0, [0, 0, 1], [1, 2, 2]), episode(0.0, [2, 2], [2])]
    metrics = policy_version_metrics(rollouts)
    assert metrics["policy/versions_per_episode"] == pytest.approx((3 + 1) / 2)
    assert metrics["policy/tokens_per_version"] == pytest.approx(9 / 4)


class Spanning(LongTailed):
    """Like LongTailed, and a request reports its first half at its start version, the rest at the current one."""

    async def __call__(self, server: int, prompt_ids: list[int], max_tokens: int, seed: int, priority: int) -> Any:
        generation: Generation = await super().__call__(server, prompt_ids, max_tokens, seed, priority)
        n = len(generation.token_ids)
        start = generation.policy_version_start or 0
        generation.token_policy_versions = [start] * (n // 2) + [self.version] * (n - n // 2)
        return generation


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(build_tokenizer(PRESETS["test"]))


def drive_across_updates(tmp_path: Path, renderer: ChatRenderer, **overrides: Any) -> dict[str, Any]:
    """Eight steps with some requests hanging, then released; four steps more. What was cancelled and trained."""
    fake = Spanning(hang=0.08)

    async def scenario() -> dict[str, Any]:
        scheduler = make_scheduler(
            tmp_path, renderer, fake, max_async_rollout=1, max_off_policy_steps=2, number_of_steps=12, **overrides
        )
        scheduler.start()
        canceled, trained = 0, []
        for step in range(12):
            if step == 8:
                fake.release.set()
            ready = await asyncio.wait_for(scheduler.next_batch(step), 60)
            batch = build_training_batch(step, [g.group for g in ready], GRPO(AlgorithmConfig()), {}, step - 2)
            older = sum(
                version < step - 2 for g in ready for r in g.group.rollouts for version in generated_versions(r)
            )
            dispatched = [g.dispatch_version for g in ready]
            trained.append((step, dispatched, batch.metadata["stale_tokens_masked"], older))
            fake.version = step + 1
            await scheduler.set_policy_version(step + 1)
            canceled += scheduler.take_stats().canceled_rollouts
        requests_cancelled = len(fake.cancelled)  # before close() cancels what is still in flight
        await scheduler.close()
        return {"canceled": canceled, "requests_cancelled": requests_cancelled, "trained": trained}

    return asyncio.run(scenario())


def test_requests_continue_across_updates_and_their_stale_tokens_are_masked(
    tmp_path: Path, renderer: ChatRenderer
) -> None:
    result = drive_across_updates(tmp_path, renderer, stale_token_policy="mask", continue_requests_across_updates=True)
    assert result["canceled"] == 0 and result["requests_cancelled"] == 0
    # a group dispatched more than max_off_policy_steps versions before its step trained, its old tokens masked
    spanned = [step for step, versions, _, _ in result["trained"] if min(versions) < step - 2]
    assert spanned, f"no group spanning the updates was trained: {result['trained']}"
    # what was masked is exactly the generated tokens older than the step allows (counted from the tokens,
    # not from the dispatch version: a request may start after its group was dispatched)
    assert all(masked == expected for _, _, masked, expected in result["trained"])
    assert sum(masked for _, _, masked, _ in result["trained"]) > 0


def test_by_default_stale_requests_are_cancelled(tmp_path: Path, renderer: ChatRenderer) -> None:
    result = drive_across_updates(tmp_path, renderer)
    assert result["canceled"] > 0 and result["requests_cancelled"] > 0
    assert all(min(versions) >= step - 2 for step, versions, _, _ in result["trained"])
