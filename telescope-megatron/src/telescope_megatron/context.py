"""Context parallelism: every packed sequence split over the context-parallel ranks, load-balanced.

Design. With ``megatron_context_parallel_size`` = CP, a packed row of ``S`` tokens
(padded to a multiple of ``2 CP``) is cut into ``2 CP`` chunks and rank ``r`` keeps
chunks ``r`` and ``2 CP - 1 - r`` (megatron-core's load-balanced split: under a causal
mask the early chunks are cheap and the late ones dear, so each rank gets one of each;
:func:`telescope.trainer.context_parallel.local_indices`, shared with the fsdp backend's
context parallelism). Each rank embeds and runs the layers on its own tokens only; in
attention its queries see the keys and values of *every* rank (:func:`gather_sequence`,
an all-gather whose backward sums the gradients back over the ranks), with the rows of
the packed block-diagonal causal mask that belong to its tokens, its columns in the
gathered order (:func:`telescope.trainer.context_parallel.gathered_order`). At the end
the logits are gathered and put back in sequence order (:func:`gather_logits`), so every
context-parallel rank computes the same loss from the same full logits as without
context parallelism; the backward of that gather keeps each rank's own rows. Every
weight's gradient is then a partial sum on each rank, summed over the context-parallel
group before clipping (the backend does it).

Why not megatron-core's own: its context parallelism lives in Transformer Engine's
attention (``TEDotProductAttention``); the local ``DotProductAttention`` refuses it
(megatron-core 0.16). Limits: keys and values are all-gathered (no ring exchange),
so attention memory per rank is that of the whole sequence's keys; the logits are
gathered (``S x V`` per rank), as they are over the vocabulary.
"""

from __future__ import annotations

import torch


def gather_sequence(tensor: torch.Tensor) -> torch.Tensor:
    """All-gather ``[S_local, ...]`` over the context-parallel ranks; the backward sums and keeps this rank's rows."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

    group = parallel_state.get_context_parallel_group()
    return gather_from_sequence_parallel_region(tensor, tensor_parallel_output_grad=True, group=group)


def gather_logits(logits: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Every rank's logits ``[S_local, 1, V]`` as ``[S, 1, V]`` in sequence order; the backward keeps this rank's rows.

    Every context-parallel rank computes the same loss from the gathered logits, so
    the gradient of its own rows is already the whole gradient (no sum).
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

    group = parallel_state.get_context_parallel_group()
    gathered = gather_from_sequence_parallel_region(logits, tensor_parallel_output_grad=False, group=group)
    return gathered[torch.argsort(order)]
