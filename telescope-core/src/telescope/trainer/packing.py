"""Sequence packing: training samples into sequences of at most ``seq_len`` tokens.

Samples are placed first-fit-decreasing (longest first, each into the first packed
sequence with room), and each packed sequence is padded up to a multiple of
``pad_to_multiple_of``. Attention stays inside each sample through per-sample
``position_ids`` (restarting at 0): the transformers path infers the document
boundaries from them (no attention mask, ``use_cache=False``), and with
flash-attention 2 it uses the varlen kernel from the same boundaries. Padding forms
its own trailing document, with every loss quantity zero.

Targets are stored shifted: position ``p`` holds the token that the logits at ``p``
predict (``token_ids[p + 1]`` of the same sample), with that token's loss mask,
inference log-probability and the sample's advantage. A sample's last position
(and every padding position) predicts nothing.

Overflow: a sample longer than ``seq_len`` is an error with ``overflow="error"``;
with ``overflow="truncate"`` its tail is cut to ``seq_len`` tokens and it is counted
in :attr:`PackedBatch.truncated_samples` / ``truncated_tokens`` (the trainer reports
them as ``packing/truncated_samples``). Nothing is ever silently corrupted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from telescope.api.records import TrainingSample

OverflowPolicy = Literal["error", "truncate"]


class SampleTooLongError(ValueError):
    """A sample does not fit in one packed sequence."""


@dataclass
class PackedSequence:
    """One packed sequence (one micro-batch row); every list has the padded length."""

    input_ids: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    target_ids: list[int] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)
    inference_logprobs: list[float] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    #: Index of the sample within this sequence for each position, -1 on padding.
    sequence_ids: list[int] = field(default_factory=list)
    #: Index into the packed batch's input samples, one per sample in this sequence.
    sample_indices: list[int] = field(default_factory=list)
    #: Loss tokens of each sample in this sequence.
    sample_loss_tokens: list[int] = field(default_factory=list)
    #: Lengths of the documents (samples, then padding if any), for varlen kernels.
    document_lengths: list[int] = field(default_factory=list)
    num_real_tokens: int = 0
    #: With shared prefixes only (:mod:`telescope.trainer.prefix_sharing`): one
    #: ``(start, length, prefix_start, prefix_length)`` per document, the prefix being
    #: the earlier span of the row the document continues (``prefix_length`` 0: none).
    documents: list[tuple[int, int, int, int]] = field(default_factory=list)
    #: Tokens this row did not compute because samples shared them (prefix tokens x (samples - 1)).
    shared_tokens: int = 0

    @property
    def length(self) -> int:
        return len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.sample_loss_tokens)


@dataclass
class PackedBatch:
    """The packed sequences of a list of samples, and what packing cost."""

    sequences: list[PackedSequence]
    truncated_samples: int = 0
    truncated_tokens: int = 0

    @property
    def num_real_tokens(self) -> int:
        return sum(s.num_real_tokens for s in self.sequences)

    @property
    def num_padded_tokens(self) -> int:
        return sum(s.length for s in self.sequences)

    @property
    def efficiency(self) -> float:
        """Real tokens over padded tokens (1.0 = no padding)."""
        return self.num_real_tokens / self.num_padded_tokens if self.sequences else 1.0


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of item indices, each with a total length <= capacity (longest items placed first).

    Ties keep input order, so packing is deterministic (every rank computes the same bins).
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


def _append_sample(seq: PackedSequence, sample: TrainingSample, sample_index: int, length: int, begin: int = 0) -> None:
    """Positions ``begin .. length - 1`` of ``sample`` (``begin`` > 0: after a shared prefix, see
    :mod:`telescope.trainer.prefix_sharing`), each with the target it has in the whole sample."""
    local_id = len(seq.sample_indices)
    tokens = sample.token_ids[begin:length]
    targets_mask = [bool(m) for m in sample.loss_mask[begin + 1 : length]] + [False]
    seq.input_ids.extend(tokens)
    seq.position_ids.extend(range(begin, length))
    seq.target_ids.extend([*tokens[1:], 0])
    seq.loss_mask.extend(targets_mask)
    seq.inference_logprobs.extend([*sample.inference_logprobs[begin + 1 : length], 0.0])
    seq.advantages.extend([sample.advantage] * (length - begin))
    seq.sequence_ids.extend([local_id] * (length - begin))
    seq.sample_indices.append(sample_index)
    seq.sample_loss_tokens.append(sum(targets_mask))
    seq.document_lengths.append(length - begin)
    seq.num_real_tokens += length - begin


def _pad(seq: PackedSequence, target_length: int, pad_token_id: int) -> None:
    pad = target_length - seq.length
    if pad <= 0:
        return
    seq.input_ids.extend([pad_token_id] * pad)
    seq.position_ids.extend(range(pad))
    seq.target_ids.extend([0] * pad)
    seq.loss_mask.extend([False] * pad)
    seq.inference_logprobs.extend([0.0] * pad)
    seq.advantages.extend([0.0] * pad)
    seq.sequence_ids.extend([-1] * pad)
    seq.document_lengths.append(pad)
    if seq.documents:
        start = seq.length - pad
        seq.documents.append((start, pad, start, 0))


def empty_sequence(length: int, pad_token_id: int) -> PackedSequence:
    """A padding-only sequence (no loss tokens): a rank with no data runs it to keep collectives in step."""
    seq = PackedSequence()
    _pad(seq, length, pad_token_id)
    return seq


def pack_samples(
    samples: Sequence[TrainingSample],
    seq_len: int,
    pad_to_multiple_of: int = 1,
    pad_token_id: int = 0,
    overflow: OverflowPolicy = "error",
) -> PackedBatch:
    """Pack ``samples`` first-fit-decreasing into sequences of at most ``seq_len`` tokens.

    The first token of a sample is never a target (nothing predicts it), so a loss
    mask that is true there is ignored.
    """
    lengths: list[int] = []
    truncated_samples = truncated_tokens = 0
    for i, sample in enumerate(samples):
        n = len(sample.token_ids)
        if n > seq_len:
            if overflow == "error":
                raise SampleTooLongError(
                    f"sample {i} has {n} tokens but seq_len is {seq_len}; raise seq_len (and keep "
                    "max_model_len <= seq_len) or pack with overflow='truncate'"
                )
            truncated_samples += 1
            truncated_tokens += n - seq_len
            n = seq_len
        lengths.append(n)
    sequences: list[PackedSequence] = []
    for bin_items in first_fit_decreasing(lengths, seq_len):
        seq = PackedSequence()
        for i in bin_items:
            _append_sample(seq, samples[i], i, lengths[i])
        _pad(seq, min(_round_up(seq.length, pad_to_multiple_of), max(seq_len, seq.length)), pad_token_id)
        sequences.append(seq)
    return PackedBatch(sequences, truncated_samples, truncated_tokens)


def split_minibatches(samples: Sequence[TrainingSample], number_of_minibatches: int) -> list[list[TrainingSample]]:
    """Split by prompt group into ``number_of_minibatches`` contiguous parts (groups never split).

    Groups are dealt in order of ``group_index`` so that the parts hold nearly equal
    numbers of groups; with fewer groups than parts, the trailing parts are empty.
    """
    if number_of_minibatches <= 1:
        return [list(samples)]
    groups: dict[int, list[TrainingSample]] = {}
    for sample in samples:
        groups.setdefault(sample.group_index, []).append(sample)
    keys = sorted(groups)
    parts: list[list[TrainingSample]] = [[] for _ in range(number_of_minibatches)]
    for position, key in enumerate(keys):
        parts[position * number_of_minibatches // max(len(keys), 1)].extend(groups[key])
    return parts


def assign_to_ranks(sequences: Sequence[PackedSequence], world_size: int) -> list[list[int]]:
    """Sequence indices per rank, balancing real tokens (longest first onto the lightest rank)."""
    loads = [0] * world_size
    assignment: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(sequences)), key=lambda i: (-sequences[i].num_real_tokens, i)):
        rank = min(range(world_size), key=lambda r: (loads[r], len(assignment[r]), r))
        assignment[rank].append(i)
        loads[rank] += sequences[i].num_real_tokens
    return [sorted(a) for a in assignment]
