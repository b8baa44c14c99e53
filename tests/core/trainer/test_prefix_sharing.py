"""Shared prompts: each group's prefix packed once, with the same targets, losses, gradients and update."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from telescope.api.records import TrainingBatch, TrainingSample
from telescope.testing.trainer import max_weight_diff, tiny_trainer_config, weights_snapshot
from telescope.trainer.fsdp import FSDPBackend
from telescope.trainer.packing import PackedBatch, pack_samples
from telescope.trainer.prefix_sharing import pack_with_shared_prefixes, shared_prefix_length


def grouped_batch(seed: int = 0, groups: int = 3, group_size: int = 4, prompt: int = 9) -> TrainingBatch:
    """Groups whose samples share their prompt's tokens, then differ (completions of 2 to 14 tokens)."""
    rng = random.Random(seed)
    samples = []
    for g in range(groups):
        prompt_ids = [rng.randrange(3, 300) for _ in range(prompt + g)]
        for k in range(group_size):
            completion = [rng.randrange(3, 300) for _ in range(rng.randint(2, 14))]
            n = len(prompt_ids) + len(completion)
            mask = [False] * len(prompt_ids) + [True] * len(completion)
            logprobs = [0.0] * len(prompt_ids) + [-rng.uniform(1.0, 6.0) for _ in completion]
            samples.append(
                TrainingSample(prompt_ids + completion, mask, logprobs, (-1.0) ** k * (k + 1) / 3, group_index=g)
            )
            assert len(samples[-1].token_ids) == n
    return TrainingBatch(samples=samples, step=0)


def _sample(tokens: list[int], trained_from: int, group: int = 0) -> TrainingSample:
    mask = [i >= trained_from for i in range(len(tokens))]
    return TrainingSample(tokens, mask, [0.0] * len(tokens), 1.0, group_index=group)


def test_shared_prefix_is_the_common_prefix_less_its_last_token() -> None:
    group = [_sample([5, 6, 7, 8, 1], 4), _sample([5, 6, 7, 9], 3), _sample([5, 6, 7, 8, 2, 2], 4)]
    assert shared_prefix_length(group) == 2  # common [5, 6, 7]; 7 stays in each segment to predict its own next token
    assert shared_prefix_length(group[:1]) == 0  # nothing to share with


def test_trained_positions_are_never_shared() -> None:
    # identical multi-turn histories whose second token is trained: only position 0 (predicting token 1) may be shared
    group = [_sample([5, 6, 7, 8, 1], 2), _sample([5, 6, 7, 8, 2], 2)]
    assert shared_prefix_length(group) == 1
    assert shared_prefix_length([_sample([5, 6, 7], 1), _sample([5, 6, 9], 1)]) == 0


def test_every_sample_keeps_its_targets_and_the_prompt_is_packed_once() -> None:
    batch = grouped_batch()
    plain = pack_samples(batch.samples, 256)
    shared = pack_with_shared_prefixes(batch.samples, 256)

    def per_sample(packed: PackedBatch) -> dict[int, list[tuple[int, int, bool, float, float]]]:
        out: dict[int, list[tuple[int, int, bool, float, float]]] = {}
        for seq in packed.sequences:
            for p, local in enumerate(seq.sequence_ids):
                if local >= 0:
                    rows = out.setdefault(seq.sample_indices[local], [])
                    rows.append(
                        (
                            seq.position_ids[p],
                            seq.target_ids[p],
                            seq.loss_mask[p],
                            seq.inference_logprobs[p],
                            seq.advantages[p],
                        )
                    )
        return out

    by_plain, by_shared = per_sample(plain), per_sample(shared)
    for index, rows in by_shared.items():
        trained_plain = [r for r in by_plain[index] if r[2]]
        assert [r for r in rows if r[2]] == trained_plain  # every trained position, with its target, identically
        assert rows == by_plain[index][-len(rows) :]  # the segment is the tail of the unshared sample
    saved = sum(s.shared_tokens for s in shared.sequences)
    assert saved == sum((9 + g - 1) * 3 for g in range(3))  # (prompt - 1) x (group size - 1) per group
    assert shared.num_real_tokens == plain.num_real_tokens - saved
    assert sum(s.num_loss_tokens for s in shared.sequences) == sum(s.num_loss_tokens for s in plain.sequences)


def test_a_group_too_long_for_one_row_is_split_with_a_prefix_copy_each() -> None:
    batch = grouped_batch(groups=1, group_size=6)
    longest = max(len(s.token_ids) for s in batch.samples)
    packed = pack_with_shared_prefixes(batch.samples, longest + 14)
    assert len(packed.sequences) > 1
    assert all(seq.length <= longest + 14 for seq in packed.sequences)
    assert sorted(i for seq in packed.sequences for i in seq.sample_indices) == list(range(6))


def _backend(model: Path, share: bool) -> FSDPBackend:
    from telescope.plugins.facade import get_plugins

    config = tiny_trainer_config(
        model,
        seq_len=128,
        pad_to_multiple_of=8,
        max_model_len=40,
        max_tokens=16,
        share_prompt_prefixes=share,
        learning_rate=1e-2,
    )
    backend = get_plugins().create_trainer_backend(config, get_plugins().create_algorithm(config))
    assert isinstance(backend, FSDPBackend)
    backend.setup()
    return backend


def _step(model: Path, share: bool) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    backend = _backend(model, share)
    try:
        assert backend.shares_prefixes is share
        return backend.train_step(grouped_batch()), weights_snapshot(backend)
    finally:
        backend.close()


def _gradients(model: Path, share: bool) -> dict[str, torch.Tensor]:
    backend = _backend(model, share)
    try:
        backend.accumulate_gradients(grouped_batch().samples)
        return backend.full_gradients()
    finally:
        backend.close()


def test_shared_prompts_give_the_unshared_gradient(tiny_model: Path) -> None:
    shared, plain = _gradients(tiny_model, share=True), _gradients(tiny_model, share=False)
    assert shared.keys() == plain.keys()
    assert max(float(g.abs().max()) for g in plain.values()) > 1e-3
    for name, grad in plain.items():
        torch.testing.assert_close(shared[name], grad, rtol=1e-5, atol=1e-7, msg=f"gradient of {name}")


def test_one_step_with_shared_prompts_equals_the_unshared_step(tiny_model: Path) -> None:
    shared_metrics, shared_weights = _step(tiny_model, share=True)
    plain_metrics, plain_weights = _step(tiny_model, share=False)
    assert shared_metrics["packing/shared_prefix_tokens"] == sum((9 + g - 1) * 3 for g in range(3))
    assert plain_metrics["packing/shared_prefix_tokens"] == 0
    for key in ("loss", "grad_norm", "entropy", "kl_divergence_inference", "train/loss_tokens"):
        assert shared_metrics[key] == pytest.approx(plain_metrics[key], rel=1e-5, abs=1e-7), key
    # Adam's first step is about lr x sign(gradient), so float noise on a near-zero gradient moves a weight by
    # up to ~1% of lr either way; the gradients themselves are compared tightly above.
    assert max_weight_diff(shared_weights, plain_weights) < 1e-2 * 1e-2
    assert max_weight_diff(shared_weights, _untrained(tiny_model)) > 1e-3  # the step did move the weights


def _untrained(model: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    return {name: tensor.detach().clone() for name, tensor in loaded.state_dict().items()}
