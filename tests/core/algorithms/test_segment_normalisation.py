"""How the segments of a compacted episode weigh in the loss, checked against a hand computation.

One group of two episodes, both rewarded by one advantage each (``+a`` and ``-a``, the
group's): episode A was compacted once, so it trains as two samples, its closed segment
(3 generated tokens, the summary among them) and its main sequence (2); episode B is one
sample of 4 generated tokens. The batch is built and packed as a run does it, and the
gradient of the objective ``sum(loss_terms) / loss_denominator`` with respect to each
generated token's log-probability (at ratio 1) is compared with the hand-computed one:

- token mean (grpo, the default): every loss token weighs ``1 / 9`` (9 loss tokens in
  all): ``-a / 9`` on A's five tokens, ``+a / 9`` on B's four. A compacted episode weighs
  what it would as one sequence: by its generated tokens.
- sequence mean (gspo): every *sample* weighs ``1 / 3`` (3 samples), spread over its
  tokens: ``-a / (3 x 3)`` on A's segment, ``-a / (2 x 3)`` on A's main sequence,
  ``+a / (4 x 3)`` on B. So A, in two segments, weighs twice what B does.
- dr_grpo ``token_sum_norm``: ``samples x max_tokens`` counts the segments as samples:
  ``-a / (3 x 16)`` and ``+a / (3 x 16)``.
"""

from __future__ import annotations

import pytest
import torch

from telescope.algorithms.dr_grpo import DrGRPO
from telescope.algorithms.grpo import GRPO
from telescope.algorithms.gspo import GSPO
from telescope.algorithms.plugin import DrGrpoSettings
from telescope.api.algorithm import Algorithm, AlgorithmConfig, LossCounts, LossInputs
from telescope.api.records import Group, RewardResult, Rollout, Sample, Turn
from telescope.orchestrator.batching import build_training_batch
from telescope.trainer.packing import pack_samples

SAMPLE = Sample(prompt="p", sample_id="0")
MAX_TOKENS = 16


def turn(generated: int, first_id: int) -> Turn:
    ids = list(range(first_id, first_id + generated))
    return Turn([3, 4], ids, [-0.5] * generated, policy_version=0)


def batch_gradients(algorithm: Algorithm) -> tuple[float, dict[tuple[int, int], list[float]]]:
    """The group's advantage ``a`` and, per (rollout, segment) sample, the gradient on its loss tokens."""
    compacted = Rollout(SAMPLE, [turn(2, 20)], segments=[[turn(3, 10)]], reward=RewardResult(1.0))
    single = Rollout(SAMPLE, [turn(4, 30)], reward=RewardResult(0.0))
    batch = build_training_batch(0, [Group(SAMPLE, [compacted, single])], algorithm, {})
    assert [(s.rollout_index, s.segment_index, s.num_loss_tokens) for s in batch.samples] == [
        (0, 0, 3),
        (0, 1, 2),
        (1, 0, 4),
    ]
    (packed,) = pack_samples(batch.samples, seq_len=64).sequences
    logprobs = torch.tensor(packed.inference_logprobs, dtype=torch.float64, requires_grad=True)
    inputs = LossInputs(
        logprobs=logprobs,
        ref_logprobs=logprobs.detach().clone(),
        inference_logprobs=logprobs.detach().clone(),
        advantages=torch.tensor(packed.advantages, dtype=torch.float64),
        loss_mask=torch.tensor(packed.loss_mask),
        sequence_ids=torch.tensor(packed.sequence_ids),
        sequence_lengths=torch.tensor(packed.sample_loss_tokens),
    )
    counts = LossCounts(loss_tokens=batch.num_loss_tokens, samples=len(batch.samples))
    objective = algorithm.loss_terms(inputs).sum() / algorithm.loss_denominator(counts)
    objective.backward()
    assert logprobs.grad is not None
    gradients: dict[tuple[int, int], list[float]] = {}
    for position, (sequence, masked) in enumerate(zip(packed.sequence_ids, packed.loss_mask, strict=True)):
        if masked:
            sample = batch.samples[packed.sample_indices[sequence]]
            gradients.setdefault((sample.rollout_index, sample.segment_index), []).append(
                float(logprobs.grad[position])
            )
    advantage = batch.samples[0].advantage
    assert advantage > 0 and [s.advantage for s in batch.samples] == [advantage, advantage, -advantage]
    return advantage, gradients


def assert_hand(
    gradients: dict[tuple[int, int], list[float]], a: float, hand: dict[tuple[int, int], tuple[float, int]]
) -> None:
    """Per sample, ``n`` loss tokens each with gradient ``weight x a`` (``hand[key] = (weight, n)``)."""
    assert sorted(gradients) == sorted(hand)
    for key, (weight, n) in hand.items():
        assert gradients[key] == pytest.approx([weight * a] * n), key


def test_token_mean_weighs_every_generated_token_alike() -> None:
    a, gradients = batch_gradients(GRPO(AlgorithmConfig(advantage_norm="group")))
    assert_hand(gradients, a, {(0, 0): (-1 / 9, 3), (0, 1): (-1 / 9, 2), (1, 0): (1 / 9, 4)})


def test_sequence_mean_weighs_every_segment_as_a_sample() -> None:
    a, gradients = batch_gradients(GSPO(AlgorithmConfig(advantage_norm="group", clip_low=0.2, clip_high=0.2)))
    assert_hand(gradients, a, {(0, 0): (-1 / 9, 3), (0, 1): (-1 / 6, 2), (1, 0): (1 / 12, 4)})


def test_token_sum_norm_counts_segments_as_samples() -> None:
    config = AlgorithmConfig(advantage_norm="group", max_tokens=MAX_TOKENS)
    a, gradients = batch_gradients(DrGRPO(config, DrGrpoSettings(dr_grpo_loss_agg_mode="token_sum_norm")))
    weight = 1 / (3 * MAX_TOKENS)
    assert_hand(gradients, a, {(0, 0): (-weight, 3), (0, 1): (-weight, 2), (1, 0): (weight, 4)})
