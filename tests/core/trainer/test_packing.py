"""Sequence packing: first-fit-decreasing, padding, overflow, and packed == unpacked log-probabilities."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from telescope.api.records import TrainingSample
from telescope.trainer.packing import (
    SampleTooLongError,
    assign_to_ranks,
    first_fit_decreasing,
    pack_samples,
    split_minibatches,
)


def sample(n: int, prompt: int = 2, start: int = 10, advantage: float = 1.0, group: int = 0) -> TrainingSample:
    tokens = list(range(start, start + n))
    mask = [False] * prompt + [True] * (n - prompt)
    return TrainingSample(tokens, mask, [-0.5] * n, advantage, group_index=group)


def test_first_fit_decreasing() -> None:
    # sorted: 7 (i1), 5 (i0), 4 (i3), 3 (i2), 1 (i4); capacity 8:
    # 7 -> bin0 (room 1); 5 -> bin1 (room 3); 4 -> bin2 (room 4); 3 -> bin1 (room 0); 1 -> bin0
    assert first_fit_decreasing([5, 7, 3, 4, 1], 8) == [[1, 4], [0, 2], [3]]


def test_pack_layout_and_targets() -> None:
    packed = pack_samples([sample(4, start=10, advantage=2.0), sample(3, start=20, advantage=-1.0)], 16, 8)
    assert len(packed.sequences) == 1
    seq = packed.sequences[0]
    assert seq.length == 8  # 7 real tokens padded to a multiple of 8
    assert seq.input_ids == [10, 11, 12, 13, 20, 21, 22, 0]
    assert seq.position_ids == [0, 1, 2, 3, 0, 1, 2, 0]
    # targets are the next token of the same sample; a sample's last position predicts nothing
    assert seq.target_ids[:7] == [11, 12, 13, 0, 21, 22, 0]
    # mask of the *target*: sample 0 masks tokens 2, 3 -> positions 1, 2; sample 1 token 2 -> position 5
    assert seq.loss_mask == [False, True, True, False, False, True, False, False]
    assert seq.sequence_ids == [0, 0, 0, 0, 1, 1, 1, -1]
    assert seq.sample_loss_tokens == [2, 1]
    assert seq.advantages[:7] == [2.0] * 4 + [-1.0] * 3
    assert seq.document_lengths == [4, 3, 1]
    assert packed.efficiency == pytest.approx(7 / 8)


def test_too_long_is_an_error_or_a_counted_truncation() -> None:
    with pytest.raises(SampleTooLongError, match="seq_len"):
        pack_samples([sample(20)], 16, 8)
    packed = pack_samples([sample(20), sample(4)], 16, 8, overflow="truncate")
    assert packed.truncated_samples == 1 and packed.truncated_tokens == 4
    assert max(s.length for s in packed.sequences) == 16
    assert packed.num_real_tokens == 20


def test_split_minibatches_keeps_groups() -> None:
    samples = [sample(4, group=g) for g in (0, 0, 1, 1, 2, 2, 3, 3)]
    parts = split_minibatches(samples, 2)
    assert [[s.group_index for s in p] for p in parts] == [[0, 0, 1, 1], [2, 2, 3, 3]]


def test_assign_to_ranks_balances_tokens() -> None:
    # sequences of 7, 5 + 2 and 4 real tokens: longest first onto the lightest rank -> [7 + 4, 7]
    packed = pack_samples([sample(n) for n in (7, 5, 4, 2)], 7, 1)
    assignment = assign_to_ranks(packed.sequences, 2)
    loads = [sum(packed.sequences[i].num_real_tokens for i in a) for a in assignment]
    assert loads == [11, 7]


def test_packed_logprobs_equal_unpacked(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    from telescope.trainer.logprobs import token_logprobs

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    gen = torch.Generator().manual_seed(1)
    samples = [
        TrainingSample(torch.randint(3, 300, (n,), generator=gen).tolist(), [False, *[True] * (n - 1)], [0.0] * n, 1.0)
        for n in (17, 9, 30, 5, 12)
    ]
    packed = pack_samples(samples, 64, 8)
    assert len(packed.sequences) > 1
    temperature = 0.7
    with torch.no_grad():
        for seq in packed.sequences:
            out = model(
                input_ids=torch.tensor([seq.input_ids]), position_ids=torch.tensor([seq.position_ids]), use_cache=False
            )
            packed_lp = token_logprobs(out.logits[0], torch.tensor(seq.target_ids), temperature)
            offset = 0
            for k, index in enumerate(seq.sample_indices):
                tokens = samples[index].token_ids
                n = len(tokens)
                alone = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0]
                alone_lp = token_logprobs(alone[:-1], torch.tensor(tokens[1:]), temperature)
                assert seq.document_lengths[k] == n
                diff = (packed_lp[offset : offset + n - 1] - alone_lp).abs().max().item()
                assert diff < 1e-5, f"sample {index}: packed and unpacked log-probabilities differ by {diff}"
                offset += n
