"""Context parallelism for the ``fsdp`` backend: each packed row split over CP ranks, load-balanced.

Design. With ``fsdp_context_parallel_size`` = CP, the ranks form a grid of
``trainer_num_workers / CP`` data-parallel groups of CP consecutive ranks
(:class:`ContextParallelLayout`, a ``(dp, cp)`` :class:`~torch.distributed.device_mesh.DeviceMesh`).
The CP ranks of a group train on the same micro-batches. A packed row of ``S``
tokens (padded to a multiple of ``2 CP`` with one-token samples at position 0) is
cut into ``2 CP`` chunks and rank ``r`` keeps chunks ``r`` and ``2 CP - 1 - r``
(:func:`local_indices`; the head-tail layout of torch's ``_HeadTailLoadBalancer``
and of megatron-core: under a causal mask the early chunks are cheap and the late
ones dear, so each rank gets one of each). Each rank embeds and runs the layers on
its own tokens only, with their own position ids (RoPE is per token). In attention
(:func:`context_parallel_attention`, registered with transformers'
``AttentionInterface`` as :data:`ATTENTION_NAME`, so any Hugging Face model calls
it) the local queries attend to the keys and values of *every* rank, all-gathered
with torch's autograd-aware functional collective (its backward reduce-scatters,
i.e. sums each rank's key/value gradients back to the rank that owns them), under
the rows of the packed block-diagonal causal mask that belong to the local tokens,
its columns in the gathered order (:func:`gathered_order`). The mask goes into the
model as its 4-D ``attention_mask``, which transformers hands to the attention
function unchanged (also when gradient checkpointing recomputes a layer). The
logits are gathered back into sequence order (:func:`gather_rows`, whose backward
keeps this rank's rows), so every CP rank computes the same loss from the same
full logits as without CP, and each weight's gradient on a CP rank is the part
that flows through its own tokens: the sum over the CP ranks is the whole
gradient. The FSDP backend shards over *all* ranks, so FSDP's reduce-scatter sums
those parts with the data-parallel ones in the collective it runs anyway (the
backend scales the loss by the number of ranks because FSDP averages); loss
counts and metrics are summed over the data-parallel group only, where each
micro-batch is counted once.

Why not torch's own ``context_parallel`` (torch 2.13, checked on 2 gloo CPU ranks):

- ``context_parallel(mesh, buffers=...)`` + ``scaled_dot_product_attention`` on the
  CPU raises ``NotImplementedError: Operator
  aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding
  strategy registered`` (also under ``sdpa_kernel(FLASH_ATTENTION)``): its ring
  attention dispatches only the CUDA kernels (flash, efficient, cuDNN). With an
  ``attn_mask`` it fails earlier (``RuntimeError: Sharding dim 2 greater than
  tensor ndim 2``) and its efficient/cuDNN handlers refuse masks (``attn_bias is
  not supported yet``): on a GPU too it computes only ``is_causal`` attention,
  which lets a packed sample see the samples before it in its row.
- ``_templated_ring_attention`` / ``_templated_ring_attention_backward`` driven with
  ``aten._scaled_dot_product_flash_attention_for_cpu`` (which returns the output
  and the logsumexp) and its ``_backward`` are exact on the CPU for a causal mask
  with the head-tail layout (forward 7e-8, gradients 2e-7 from full SDPA), but the
  ring slices only q/k/v per step, never a mask: no document masks.
- ``_HeadTailLoadBalancer`` gives exactly :func:`local_indices`;
  ``_context_parallel_shard`` / ``context_parallel_unshard`` work on the CPU, but
  the unshard is ``torch.no_grad`` (no gradient through the gathered logits);
  ``_PerDocumentHeadTailLoadBalancer`` balances per document for flex attention.
- Flex attention's CP path (``_create_cp_block_mask``, which takes document masks)
  needs ``Q_LEN`` a multiple of ``CP x 128``, compiles the block-mask builder, and
  on the CPU its backward raises ``NotImplementedError: FlexAttention does not
  support backward on CPU``.
- ``torch.distributed.nn.functional.all_gather`` (deprecated) fails in its gloo
  backward on a subgroup that does not hold global rank 0 (``ValueError: Global
  rank 0 is not part of group``); ``_functional_collectives.all_gather_tensor_autograd``
  (used here) works on such subgroups.

So this all-gather design runs everywhere (CPU and GPU, SDPA with a boolean mask,
whatever attention the model would use at CP 1). Limits: keys and values are
all-gathered (no ring exchange), so attention memory per rank is that of the
whole row's keys, and the mask is ``S / CP x S`` booleans; the logits are
gathered (``S x V`` per rank); a GPU run has not been verified in this project yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

#: The transformers attention implementation name under which :func:`context_parallel_attention` is registered.
ATTENTION_NAME = "telescope_context_parallel"

#: The keyword the model forward passes down to the attention function (transformers forwards extra kwargs).
GROUP_KWARG = "context_parallel_group"


def local_indices(length: int, cp: int, rank: int, device: torch.device) -> torch.Tensor:
    """The positions rank ``rank`` keeps of a row of ``length`` tokens (``length`` a multiple of ``2 cp``)."""
    chunk = length // (2 * cp)
    first = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    second = torch.arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk, device=device)
    return torch.cat([first, second])


def gathered_order(length: int, cp: int, device: torch.device) -> torch.Tensor:
    """The sequence position of each row of a gather over the ranks (rank 0's rows, then rank 1's, ...)."""
    return torch.cat([local_indices(length, cp, rank, device) for rank in range(cp)])


@dataclass(frozen=True)
class ContextParallelLayout:
    """This rank's place in the ``(data parallel, context parallel)`` grid; global rank = dp_rank * CP + cp_rank.

    At CP 1 the groups are ``None``: the data-parallel group is the default (whole) group.
    """

    cp_size: int = 1
    cp_rank: int = 0
    cp_group: ProcessGroup | None = None
    dp_size: int = 1
    dp_rank: int = 0
    dp_group: ProcessGroup | None = None

    @classmethod
    def build(cls, rank: int, world_size: int, cp_size: int, device: torch.device) -> ContextParallelLayout:
        """Split the (initialised) default group; CP consecutive ranks share each packed row."""
        if cp_size < 1 or world_size % cp_size:
            raise ValueError(
                f"trainer_num_workers ({world_size}) must be a multiple of fsdp_context_parallel_size ({cp_size})"
            )
        if cp_size == 1:
            return cls(dp_size=world_size, dp_rank=rank)
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world_size // cp_size, cp_size), mesh_dim_names=("dp", "cp"))
        return cls(
            cp_size=cp_size,
            cp_rank=mesh.get_local_rank("cp"),
            cp_group=mesh.get_group("cp"),
            dp_size=world_size // cp_size,
            dp_rank=mesh.get_local_rank("dp"),
            dp_group=mesh.get_group("dp"),
        )


def register_attention() -> str:
    """Register :func:`context_parallel_attention` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, context_parallel_attention)
    return ATTENTION_NAME


def context_parallel_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Local queries ``[B, H, S/CP, D]`` over every rank's keys and values, under ``attention_mask`` (True: attend).

    The transformers attention-function signature; returns ``([B, S/CP, H, D], None)``
    as transformers' ``sdpa`` does. ``attention_mask`` is this rank's rows of the
    document mask, columns in the gathered order (:func:`sharded_logits` builds it);
    the CP group comes in ``kwargs[GROUP_KWARG]``.
    """
    group = kwargs.get(GROUP_KWARG)
    if group is None or attention_mask is None:
        raise RuntimeError(
            f"attention {ATTENTION_NAME!r} needs the context-parallel group and mask: "
            "call the model through telescope.trainer.context_parallel.sharded_logits"
        )
    key, value = gather_sequence(key, group), gather_sequence(value, group)
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: one key/value head per `groups` query heads
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
    )
    return out.transpose(1, 2).contiguous(), None


def gather_sequence(tensor: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """All-gather ``[B, H, S_local, D]`` over the group along the sequence (rank 0's rows first).

    torch's autograd-aware functional collective: the backward reduce-scatters, i.e.
    sums the gradients every rank's queries put on these keys (or values) and hands
    each rank those of its own rows. Gathered along dim 0 (the dimension torch
    documents for it), the sequence moved there and back.
    """
    from torch.distributed import _functional_collectives as funcol

    gather = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd
    gathered: torch.Tensor = gather(tensor.movedim(2, 0).contiguous(), 0, group)
    return gathered.movedim(0, 2)


class _GatherRows(torch.autograd.Function):
    """All-gather ``[S_local, ...]`` along dim 0; the backward keeps this rank's rows (no sum).

    Every context-parallel rank computes the same loss from the same gathered
    tensor, so the gradient of its own rows is already the whole gradient.
    """

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
        ctx.rank, ctx.size = torch.distributed.get_rank(group), torch.distributed.get_world_size(group)
        parts = [torch.empty_like(local) for _ in range(ctx.size)]
        torch.distributed.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.chunk(ctx.size)[ctx.rank].contiguous(), None


def gather_rows(local: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """Every rank's ``[S_local, ...]`` rows, rank 0's first; see :class:`_GatherRows` for the backward."""
    gathered: torch.Tensor = _GatherRows.apply(local, group)
    return gathered


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """The sample index of each position of a packed row ``[S]``: a new sample wherever the position id is not
    the previous one plus 1 (transformers' rule for packed rows)."""
    previous = torch.cat([position_ids[:1] - 1, position_ids[:-1]])
    return torch.cumsum((position_ids - previous != 1).long(), dim=0)


def local_mask(position_ids: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """``[1, 1, len(rows), len(columns)]`` booleans, True where token ``rows[i]`` attends to ``columns[j]``:
    same sample, not later."""
    documents = document_ids(position_ids)
    same = documents[rows][:, None] == documents[columns][None, :]
    return (same & (rows[:, None] >= columns[None, :]))[None, None]


def sharded_logits(
    model: Any, input_ids: torch.Tensor, position_ids: torch.Tensor, layout: ContextParallelLayout, pad_token_id: int
) -> torch.Tensor:
    """Full logits ``[S, V]`` of one packed row ``[1, S]``, this rank computing its load-balanced chunks.

    Collective over the CP group: every CP rank calls it with the same row. The
    model must run with ``attn_implementation`` :data:`ATTENTION_NAME`.
    """
    length = input_ids.shape[1]
    cp, multiple = layout.cp_size, 2 * layout.cp_size
    extra = -length % multiple
    if extra:  # one-token samples at position 0: no real token attends to them, their logits are cut
        input_ids = torch.nn.functional.pad(input_ids, (0, extra), value=pad_token_id)
        position_ids = torch.nn.functional.pad(position_ids, (0, extra))
    padded = length + extra
    mine = local_indices(padded, cp, layout.cp_rank, input_ids.device)
    order = gathered_order(padded, cp, input_ids.device)
    output = model(
        input_ids=input_ids[:, mine],
        position_ids=position_ids[:, mine],
        attention_mask=local_mask(position_ids[0], mine, order),
        use_cache=False,
        **{GROUP_KWARG: layout.cp_group},
    )
    assert layout.cp_group is not None
    logits = gather_rows(output.logits[0], layout.cp_group)
    return logits[torch.argsort(order)][:length]
