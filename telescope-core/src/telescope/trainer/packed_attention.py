"""Attention over packed rows at the cost of each document alone, without flash-attn.

Why. The trainer packs many samples into one row and keeps them apart with
per-document ``position_ids``. With ``flash_attention_2`` (CUDA + the ``flash_attn``
package) transformers turns those into ``cu_seqlens`` and the varlen kernel computes
each document's attention alone. Everywhere else (the CPU, a GPU without
flash-attn) transformers' ``sdpa`` path builds a block-diagonal ``S x S`` mask and
computes attention over the *whole* row: for a row of 64 Countdown samples of ~44
tokens that is ``2048^2`` scores per head and layer where the documents need
``64 x 44^2`` (45x fewer), and on the CPU it was most of the train step's time
(measured: ``bench/bench_trainer.py``, current figures in ``bench/README.md``).

Design. :func:`packed_attention` is registered with transformers'
``AttentionInterface`` as :data:`ATTENTION_NAME`; transformers then builds no mask
(names it has no mask function for get none) and hands the attention function the
``position_ids`` it was called with. The function cuts the row at every position
that does not continue the previous one (a document starts wherever the position
id is not the previous plus one: transformers' own packed-sequence rule), sorts the
documents into buckets by length (rounded up to one of four sizes per octave), and for each bucket
gathers its documents into a padded ``[documents, heads, length, dim]`` batch and runs
``scaled_dot_product_attention`` with ``is_causal=True``. Padding sits after each
document's last token, so the causal mask already hides it from every real query;
the padded query rows are dropped when the outputs are put back in the row. These
indices (a *plan*: per bucket the rows to gather and the outputs to keep, then one
permutation back to row order) are built once per row, where the only host
synchronisations are, and reused by every layer and by a checkpointed layer's
recomputation: the plan of the last ``position_ids`` (or documents) tensor is kept,
by identity. Gathers are ``index_select`` (their gradient an ``index_add``, not a
sorting ``index_put``).
With shared prompts (:mod:`telescope.trainer.prefix_sharing`) the backend passes the
row's documents as ``(start, length, prefix_start, prefix_length)`` through the
model's forward (:data:`DOCUMENTS_KWARG`; transformers hands extra keywords down to
the attention function): a document's keys are then its prefix's rows followed by
its own, and only its own rows' outputs are kept (the prefix's own document writes
the prefix rows). The result equals the masked full-row SDPA up to float rounding (test:
``tests/core/trainer/test_packed_attention.py``), gradients included (the
gather/scatter are autograd ops). Buckets bound the padding: a document pads by
less than a quarter of its length, so the work is under 1.6x the documents' own and
never near the full row's unless the row is one long document. On the CPU,
half-precision inputs attend in float32 and the output is cast back
(:func:`attention_compute_dtype`: PyTorch's bfloat16 CPU kernel is several times slower).

Limits: batch size 1 rows (how the trainer calls the model; other shapes fall back
to transformers' ``sdpa`` with its own mask, which then must be given) and plain
causal attention: no sliding window, no softcap, no attention sinks
(:func:`supports` says whether a model config qualifies; the backend falls back to
``sdpa`` for the others).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

#: The transformers attention implementation name :func:`packed_attention` is registered under.
ATTENTION_NAME = "telescope_packed_sdpa"

#: The keyword (passed to the model's forward, which hands it down) carrying a row's shared-prefix documents.
DOCUMENTS_KWARG = "packed_documents"


def register_packed_attention() -> str:
    """Register :func:`packed_attention` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, packed_attention)
    return ATTENTION_NAME


def supports(config: Any) -> bool:
    """Whether a Hugging Face config's attention is plain causal attention in every layer."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(kind != "full_attention" for kind in layer_types):
        return False
    if layer_types is None and getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    softcap = getattr(config, "attn_logit_softcapping", None)
    return softcap is None and not getattr(config, "use_sinks", False)


def attention_compute_dtype(query: torch.Tensor) -> torch.dtype:
    """The dtype the SDPA runs in: float32 for half-precision inputs on the CPU, else the inputs' own.

    PyTorch's CPU flash-attention kernel is slow in bfloat16, its backward most of
    all. Measured on 2 cores (torch 2.13, one thread), 64 documents of 24 or 40
    tokens, 4 heads of 32: forward and backward took 22 and 43 ms in bfloat16
    against 5.6 and 8.6 ms with the inputs cast to float32 and the output back
    (casts included). In a bfloat16 mixed-precision train step of the ``small``
    tiny model (2,246 tokens, ``bench/bench_trainer.py --precision bf16``) the
    attention backward fell from 111 to 13 ms and the step from 296-321 to
    202-229 ms (float32: 238-241 ms). On accelerators the inputs' dtype is kept.
    """
    if query.device.type == "cpu" and query.dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return query.dtype


def document_starts(position_ids: torch.Tensor) -> torch.Tensor:
    """Indices where a document starts in a 1-D row of position ids (the first token always does)."""
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[1:] = position_ids[1:] != position_ids[:-1] + 1
    return starts.nonzero().flatten()


def length_buckets(lengths: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """Documents grouped by padded length: ``(padded length, document indices)``.

    A length rounds up to a multiple of a quarter of the power of two at or below it
    (4 sizes per octave: 16, 20, 24, 28, 32, 40, 48, ...), so a document pads by less
    than a quarter of its length. Powers of two padded up to twice: a 39-token view
    (a 15-token prompt and a 24-token completion) ran at 64 and cost 1.8x the
    attention of 40 (forward and backward, 64 documents).
    """
    octave = torch.pow(2, torch.floor(torch.log2(lengths.double()))).long()
    step = torch.clamp(octave // 4, min=1)
    padded = (lengths + step - 1) // step * step
    return [(int(size), (padded == size).nonzero().flatten()) for size in torch.unique(padded).tolist()]


def documents_from_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """``[documents, 4]`` rows ``(start, length, prefix_start, prefix_length)`` of a row without shared prefixes."""
    length = position_ids.shape[0]
    starts = document_starts(position_ids)
    lengths = torch.cat([starts[1:], starts.new_tensor([length])]) - starts
    return torch.stack([starts, lengths, starts, torch.zeros_like(starts)], dim=1)


@dataclass
class _Bucket:
    """One length bucket of a row's documents: what to gather, and which gathered rows are outputs."""

    gather: torch.Tensor  # [documents * size]: the row index each padded position reads
    documents: int
    size: int
    kept: torch.Tensor  # indices into the [documents * size] outputs that are the documents' own rows


@dataclass
class _Plan:
    """How one packed row's attention runs: its buckets, and where their outputs go."""

    buckets: list[_Bucket]
    inverse: torch.Tensor | None  # row s of the output = the concatenated kept outputs' row inverse[s]
    destinations: torch.Tensor  # the row each concatenated kept output goes to


#: The last row's plan and what it was built from (kept referenced, so identity cannot be reused):
#: every layer of a forward (and a checkpointed layer's recomputation) passes the same tensor.
_last_plan: tuple[torch.Tensor, torch.device, int, _Plan] | None = None


def _build_plan(documents: torch.Tensor, length: int, device: torch.device) -> _Plan:
    """Index tensors for every bucket, computed once per row (the only host synchronisations)."""
    starts, lengths, prefix_starts, prefix_lengths = documents.to(device).unbind(dim=1)
    buckets: list[_Bucket] = []
    destinations: list[torch.Tensor] = []
    # A document's attention runs over its "view": its prefix's rows, then its own.
    for size, chosen in length_buckets(prefix_lengths + lengths):
        offsets = torch.arange(size, device=device)
        own = offsets - prefix_lengths[chosen, None]  # [documents, size]: index within the document itself
        in_prefix = own < 0
        index = torch.where(in_prefix, prefix_starts[chosen, None] + offsets, starts[chosen, None] + own)
        written = (own >= 0) & (own < lengths[chosen, None])  # the rows this document's queries produce
        index = torch.where(in_prefix | written, index, starts[chosen, None])  # padding reads a row it never sees
        buckets.append(_Bucket(index.flatten(), int(chosen.numel()), size, written.flatten().nonzero().flatten()))
        destinations.append(index[written])
    flat = torch.cat(destinations)
    inverse = None
    if flat.numel() == length:  # every row written once (the documents tile the row): a permutation
        inverse = torch.empty_like(flat)
        inverse[flat] = torch.arange(length, device=device)
        if not bool((flat.sort().values == torch.arange(length, device=device)).all()):
            inverse = None
    return _Plan(buckets, inverse, flat)


def _plan_for(key: torch.Tensor, documents: Any, length: int, device: torch.device) -> _Plan:
    global _last_plan
    if _last_plan is not None and _last_plan[0] is key and _last_plan[1] == device and _last_plan[2] == length:
        return _last_plan[3]
    plan = _build_plan(documents() if callable(documents) else documents, length, device)
    _last_plan = (key, device, length, plan)
    return plan


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention within each packed document (after its prefix, if any); ``[1, S, heads, dim]``.

    The row's plan (documents, buckets, gather and scatter indices) is built once and
    reused by every layer: each layer then runs, per bucket, three ``index_select``
    gathers (their gradient is an ``index_add``), one SDPA and one ``index_select`` of
    the outputs, and one permutation puts the rows back in place, with no host
    synchronisation.
    """
    if kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None:
        raise ValueError(f"{ATTENTION_NAME} computes plain causal attention; this layer asks for more")
    documents: torch.Tensor | None = kwargs.get(DOCUMENTS_KWARG)
    plain = position_ids is None and documents is None
    if plain or query.shape[0] != 1 or attention_mask is not None or query.shape[2] != key.shape[2]:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    heads, length, dim = query.shape[1], query.shape[2], query.shape[3]
    groups = heads // key.shape[1]
    q, k, v = query[0], key[0], value[0]  # [heads, S, dim]
    if documents is not None:
        plan = _plan_for(documents, documents, length, query.device)
    else:
        assert position_ids is not None
        ids = position_ids

        def from_positions() -> torch.Tensor:
            return documents_from_positions(ids.reshape(-1)[-length:])

        plan = _plan_for(position_ids, from_positions, length, query.device)
    compute_dtype = attention_compute_dtype(query)
    outputs = []
    for bucket in plan.buckets:

        def gather(x: torch.Tensor, bucket: _Bucket = bucket) -> torch.Tensor:
            picked = x.index_select(1, bucket.gather).view(x.shape[0], bucket.documents, bucket.size, dim)
            return picked.transpose(0, 1).to(compute_dtype)  # [documents, heads, size, dim]

        out = F.scaled_dot_product_attention(
            gather(q),
            gather(k),
            gather(v),
            dropout_p=dropout if module.training else 0.0,
            is_causal=True,
            scale=scaling,
            enable_gqa=groups > 1,
        )
        rows = out.to(query.dtype).transpose(1, 2).reshape(bucket.documents * bucket.size, heads, dim)
        outputs.append(rows.index_select(0, bucket.kept))
    kept = torch.cat(outputs) if len(outputs) > 1 else outputs[0]
    if plan.inverse is not None:
        output = kept.index_select(0, plan.inverse)  # rows back in place
    else:  # rows no document writes stay zero
        output = kept.new_zeros(length, heads, dim).index_put((plan.destinations,), kept)
    return output.unsqueeze(0), None
