"""Attention over packed rows at the cost of each document alone, without flash-attn.

Why. The trainer packs many samples into one row and keeps them apart with
per-document ``position_ids``. With ``flash_attention_2`` (CUDA + the ``flash_attn``
package) transformers turns those into ``cu_seqlens`` and the varlen kernel computes
each document's attention alone. Everywhere else (the CPU, a GPU without
flash-attn) transformers' ``sdpa`` path builds a block-diagonal ``S x S`` mask and
computes attention over the *whole* row: for a row of 64 Countdown samples of ~44
tokens that is ``2048^2`` scores per head and layer where the documents need
``64 x 44^2`` (45x fewer), and on the CPU it was most of the train step's time
(measured: ``bench/bench_trainer.py``, see the README's performance notes).

Design. :func:`packed_attention` is registered with transformers'
``AttentionInterface`` as :data:`ATTENTION_NAME`; transformers then builds no mask
(names it has no mask function for get none) and hands the attention function the
``position_ids`` it was called with. The function cuts the row at every position
that does not continue the previous one (a document starts wherever the position
id is not the previous plus one: transformers' own packed-sequence rule), sorts the
documents into buckets by length rounded up to a power of two, and for each bucket
gathers its documents into a padded ``[documents, heads, length, dim]`` batch and runs
``scaled_dot_product_attention`` with ``is_causal=True``. Padding sits after each
document's last token, so the causal mask already hides it from every real query;
the padded query rows are dropped when the outputs are scattered back to the row.
With shared prompts (:mod:`telescope.trainer.prefix_sharing`) the backend passes the
row's documents as ``(start, length, prefix_start, prefix_length)`` through the
model's forward (:data:`DOCUMENTS_KWARG`; transformers hands extra keywords down to
the attention function): a document's keys are then its prefix's rows followed by
its own, and only its own rows' outputs are kept (the prefix's own document writes
the prefix rows). The result equals the masked full-row SDPA up to float rounding (test:
``tests/core/trainer/test_packed_attention.py``), gradients included (the
gather/scatter are autograd ops). Buckets bound the padding: a document pads to
less than twice its length, so the work is under 4x the documents' own and never
near the full row's unless the row is one long document.

Limits: batch size 1 rows (how the trainer calls the model; other shapes fall back
to transformers' ``sdpa`` with its own mask, which then must be given) and plain
causal attention: no sliding window, no softcap, no attention sinks
(:func:`supports` says whether a model config qualifies; the backend falls back to
``sdpa`` for the others).
"""

from __future__ import annotations

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


def document_starts(position_ids: torch.Tensor) -> torch.Tensor:
    """Indices where a document starts in a 1-D row of position ids (the first token always does)."""
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[1:] = position_ids[1:] != position_ids[:-1] + 1
    return starts.nonzero().flatten()


def length_buckets(lengths: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """Documents grouped by length rounded up to a power of two: ``(padded length, document indices)``."""
    padded = torch.pow(2, torch.ceil(torch.log2(lengths.double()))).long()
    return [(int(size), (padded == size).nonzero().flatten()) for size in torch.unique(padded).tolist()]


def documents_from_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """``[documents, 4]`` rows ``(start, length, prefix_start, prefix_length)`` of a row without shared prefixes."""
    length = position_ids.shape[0]
    starts = document_starts(position_ids)
    lengths = torch.cat([starts[1:], starts.new_tensor([length])]) - starts
    return torch.stack([starts, lengths, starts, torch.zeros_like(starts)], dim=1)


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
    """Causal attention within each packed document (after its prefix, if any); ``[1, S, heads, dim]``."""
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
    if documents is None:
        assert position_ids is not None
        documents = documents_from_positions(position_ids.reshape(-1)[-length:])
    starts, lengths, prefix_starts, prefix_lengths = documents.to(query.device).unbind(dim=1)
    output = query.new_empty(length, heads, dim)
    # A document's attention runs over its "view": its prefix's rows, then its own.
    for size, chosen in length_buckets(prefix_lengths + lengths):
        offsets = torch.arange(size, device=query.device)
        own = offsets - prefix_lengths[chosen, None]  # [documents, size]: index within the document itself
        in_prefix = own < 0
        index = torch.where(in_prefix, prefix_starts[chosen, None] + offsets, starts[chosen, None] + own)
        written = (own >= 0) & (own < lengths[chosen, None])  # the rows this document's queries produce
        index = torch.where(in_prefix | written, index, starts[chosen, None])  # padding reads a row it never sees

        def gather(x: torch.Tensor, index: torch.Tensor = index) -> torch.Tensor:
            return x[:, index].transpose(0, 1)  # [documents, heads, size, dim]

        out = F.scaled_dot_product_attention(
            gather(q),
            gather(k),
            gather(v),
            dropout_p=dropout if module.training else 0.0,
            is_causal=True,
            scale=scaling,
            enable_gqa=groups > 1,
        )
        output = output.index_put((index[written],), out.transpose(1, 2)[written])  # rows back in place
    return output.unsqueeze(0), None
