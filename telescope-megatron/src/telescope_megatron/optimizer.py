"""The megatron backend's optimizer: AdamW, its states optionally sharded over the data-parallel ranks (ZeRO-1).

Design. With ``megatron_use_distributed_optimizer`` and more than one rank holding
the same model shard (data parallel, context parallel counted in, as megatron-core
does), :func:`build_optimizer` wraps AdamW in torch's
:class:`~torch.distributed.optim.ZeroRedundancyOptimizer` over that group
(``parallel_state.get_data_parallel_group(with_context_parallel=True)``): each rank
is assigned whole parameters (largest first, each to the rank with the fewest
elements so far), keeps Adam's moments for those only and steps them; then every
rank broadcasts its updated parameters to the others. The gradients are still averaged over the
data-parallel ranks and clipped by the backend before the step (as without
sharding), so every rank steps with the same gradient and the update equals the
unsharded AdamW's. The LR schedule drives the wrapper's ``param_groups``, which
the wrapper copies into the local AdamW before each step.

Why torch's ZeRO and not megatron-core's ``DistributedOptimizer``: the latter needs
megatron-core's ``DistributedDataParallel`` wrapper and its contiguous gradient
buffers (``main_grad``), i.e. the gradient reduction that the backend does itself
(averaging, the tensor-parallel partial sums, the tied embedding, context
parallelism) would move into megatron-core's; and it does not run on the CPU:
megatron-core 0.16's ``DistributedOptimizer._build_model_and_main_param_groups``
accepts only ``torch.cuda.{Float,Half,BFloat16}Tensor`` parameters and raises
``TypeError`` for a CPU tensor, and its buffers allocate on
``torch.cuda.current_device()``. ZeRO shards any torch optimizer over any process
group (gloo or NCCL) after the backend's own reduction.

Checkpoints: each rank saves what it keeps (:func:`rank_state_dict`: the local
AdamW's state plus the hyperparameters the schedule set) and loads its own file
(:func:`load_rank_state_dict`); resuming needs the same layout, which the backend
checks.

Limits: ZeRO stage 1 only: gradients are all-reduced (not reduce-scattered) and
every rank keeps full gradients and parameters; the partition is by whole
parameters, so a rank's share of the states is ``1/N`` of the elements only up to
the largest parameter (the embedding, on small models); the states are those of
torch AdamW in the model's dtype (no separate float32 main parameters, as without
sharding); the updated parameters are broadcast one tensor at a time (no bucketing).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer


def build_optimizer(
    params: Iterable[torch.nn.Parameter],
    *,
    lr: float,
    weight_decay: float,
    shard_group: dist.ProcessGroup | None = None,
) -> torch.optim.Optimizer:
    """AdamW over ``params``; its states sharded over ``shard_group`` when it has more than one rank."""
    if shard_group is None or dist.get_world_size(shard_group) == 1:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=True)
    return ZeroRedundancyOptimizer(
        list(params),
        optimizer_class=torch.optim.AdamW,
        process_group=shard_group,
        # False: bucket views would re-point every parameter's storage, and the warm start's optimizer is a second
        # ZeRO over the same parameters (the first one's buckets would then no longer be the parameters)
        parameters_as_bucket_view=False,
        lr=lr,
        weight_decay=weight_decay,
        foreach=True,
    )


def is_sharded(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` keeps only this rank's share of the states."""
    return isinstance(optimizer, ZeroRedundancyOptimizer)


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer that holds this rank's states (the local AdamW of a sharded one)."""
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        local: torch.optim.Optimizer = optimizer.optim
        return local
    return optimizer


def rank_state_dict(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """What this rank keeps of the optimizer state, for its own checkpoint file (no collective)."""
    if not isinstance(optimizer, ZeroRedundancyOptimizer):
        return optimizer.state_dict()
    hyperparameters = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    return {"sharded": True, "param_groups": hyperparameters, "local": optimizer.optim.state_dict()}


def load_rank_state_dict(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Restore what :func:`rank_state_dict` saved on this rank (the same layout)."""
    sharded = isinstance(optimizer, ZeroRedundancyOptimizer)
    if bool(state.get("sharded")) != sharded:
        saved, here = ("sharded", "unsharded") if state.get("sharded") else ("unsharded", "sharded")
        raise ValueError(f"the checkpoint's optimizer state is {saved}, this optimizer is {here}")
    if not isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.load_state_dict(state)
        return
    if len(state["param_groups"]) != len(optimizer.param_groups):
        raise ValueError("the checkpoint's optimizer has another number of parameter groups")
    optimizer.optim.load_state_dict(state["local"])
    # the wrapper's groups are the ones the schedule reads and writes, and copied into the local one at each step
    for group, saved_group in zip(optimizer.param_groups, state["param_groups"], strict=True):
        group.update(saved_group)
