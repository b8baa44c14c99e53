"""Packing with shared prompts: a group's common prefix computed once, not once per sample.

Why. Every sample of a GRPO group starts with the same prompt. Packed one sample
per document, the trainer runs the prompt's tokens through the model once per
sample: with the CPU quick start's ~20-token prompts and ~24-token completions,
group size 8, that is 40% of the step's tokens. Sharing it computes exactly the
same logits and gradients with ``prompt x (group size - 1)`` fewer tokens.

Layout. For each group (samples with the same ``group_index``) the shared prefix is
the longest common prefix of the samples' token ids, less its last token, and
only where no shared position is trained (every loss-mask entry of those
positions and of the tokens they predict is false; a multi-turn sample's earlier
trained turns are never shared). A *unit* is the prefix (positions ``0 .. P - 1``,
its own targets, no loss) followed by one *segment* per sample: the sample's
positions ``P ..`` (the last common token first, so that the segment's first
position predicts the sample's own next token), each with the target, loss mask,
inference log-probability and advantage it has unshared (:func:`_append_sample`
with ``begin = P``). Units are placed first-fit-decreasing into rows of at most
``seq_len`` tokens; a group that does not fit one row is cut into several units,
each with its own copy of the prefix. Each row records its documents as
``(start, length, prefix_start, prefix_length)``
(:attr:`~telescope.trainer.packing.PackedSequence.documents`): a segment attends to
its prefix, then causally to itself; :mod:`telescope.trainer.packed_attention`
computes exactly that. Per-sample quantities (``sequence_ids``,
``sample_loss_tokens``) cover the segments only, which hold every loss token.

Limits: only the attention function of :mod:`telescope.trainer.packed_attention`
reads the documents, so the backend shares prefixes only where it runs that
function (not with flash-attention's varlen kernel, context parallelism or the
megatron backend); samples are never truncated here (a sample longer than
``seq_len`` falls back to :func:`~telescope.trainer.packing.pack_samples`).
"""

from __future__ import annotations

from collections.abc import Sequence

from telescope.api.records import TrainingSample
from telescope.trainer.packing import (
    PackedBatch,
    PackedSequence,
    _append_sample,
    _pad,
    _round_up,
    first_fit_decreasing,
    pack_samples,
)


def shared_prefix_length(samples: Sequence[TrainingSample]) -> int:
    """Tokens a group can share: its common prefix less the last token, none of it (or its targets) trained."""
    if len(samples) < 2:
        return 0
    first = samples[0].token_ids
    common = min(len(s.token_ids) for s in samples)
    for s in samples[1:]:
        ids = s.token_ids
        n = 0
        while n < common and ids[n] == first[n]:
            n += 1
        common = n
    share = max(common - 1, 0)
    for s in samples:  # positions 0 .. share - 1 predict tokens 1 .. share: none may carry loss
        trained = [i for i in range(1, share + 1) if s.loss_mask[i]]
        if trained:
            share = trained[0] - 1
    return max(share, 0)


def _units(samples: Sequence[TrainingSample], seq_len: int) -> list[tuple[int, list[int]]]:
    """``(prefix length, sample indices)`` units, each fitting ``seq_len`` tokens."""
    groups: dict[int, list[int]] = {}
    for i, sample in enumerate(samples):
        groups.setdefault(sample.group_index, []).append(i)
    units: list[tuple[int, list[int]]] = []
    for indices in groups.values():
        share = shared_prefix_length([samples[i] for i in indices])
        if share == 0:
            units.extend((0, [i]) for i in indices)
            continue
        current: list[int] = []
        used = share
        for i in sorted(indices, key=lambda i: (-len(samples[i].token_ids), i)):
            segment = len(samples[i].token_ids) - share
            if current and used + segment > seq_len:
                units.append((share, current))
                current, used = [], share
            current.append(i)
            used += segment
        units.append((share, current) if len(current) > 1 else (0, current))
    return units


def _append_unit(seq: PackedSequence, samples: Sequence[TrainingSample], share: int, indices: list[int]) -> None:
    if share == 0:
        (i,) = indices
        start = seq.length
        _append_sample(seq, samples[i], i, len(samples[i].token_ids))
        seq.documents.append((start, seq.length - start, start, 0))
        return
    first = samples[indices[0]]
    prefix_start = seq.length
    seq.input_ids.extend(first.token_ids[:share])
    seq.position_ids.extend(range(share))
    seq.target_ids.extend(first.token_ids[1 : share + 1])
    seq.loss_mask.extend([False] * share)
    seq.inference_logprobs.extend([0.0] * share)
    seq.advantages.extend([0.0] * share)
    seq.sequence_ids.extend([-1] * share)
    seq.document_lengths.append(share)
    seq.num_real_tokens += share
    seq.documents.append((prefix_start, share, prefix_start, 0))
    for i in indices:
        start = seq.length
        _append_sample(seq, samples[i], i, len(samples[i].token_ids), begin=share)
        seq.documents.append((start, seq.length - start, prefix_start, share))
    seq.shared_tokens += share * (len(indices) - 1)


def pack_with_shared_prefixes(
    samples: Sequence[TrainingSample], seq_len: int, pad_to_multiple_of: int = 1, pad_token_id: int = 0
) -> PackedBatch:
    """Pack ``samples`` with each group's prompt shared (see the module docstring)."""
    if any(len(s.token_ids) > seq_len for s in samples):
        return pack_samples(samples, seq_len, pad_to_multiple_of, pad_token_id, overflow="truncate")
    units = _units(samples, seq_len)
    sizes = [share + sum(len(samples[i].token_ids) - share for i in indices) for share, indices in units]
    sequences: list[PackedSequence] = []
    for bin_items in first_fit_decreasing(sizes, seq_len):
        seq = PackedSequence()
        for u in bin_items:
            _append_unit(seq, samples, *units[u])
        _pad(seq, min(_round_up(seq.length, pad_to_multiple_of), max(seq_len, seq.length)), pad_token_id)
        sequences.append(seq)
    return PackedBatch(sequences)
