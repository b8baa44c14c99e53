"""The megatron backend's optimizer: AdamW over the main parameters, its states optionally sharded (ZeRO-1).

:class:`MainAdamW` is torch's AdamW (the same update, computed by torch's own
functional ``adam``) over the *main* parameters of :mod:`telescope_megatron.precision`:
it reads each parameter's gradient from its ``main_grad`` attribute where set (a
gradient whose dtype may differ from the parameter's, as Transformer Engine's
``decoupled_grad``), else from ``grad``, and keeps ``exp_avg`` / ``exp_avg_sq`` in the
dtypes it is given (``megatron_exp_avg_dtype``, ``megatron_exp_avg_sq_dtype``). Where a
parameter, its gradient and both moments share one dtype the update is torch AdamW's
exactly (one ``foreach`` call, bit for bit); otherwise each such parameter is updated
in float32 copies (parameter, gradient, moments) and the results are rounded back
into their own dtypes, so a bfloat16 moment is stored in bfloat16 but never
accumulated in it. The state dict has torch AdamW's layout; loading it keeps the
moments in their configured dtypes (torch's loader would cast them to the parameter's).

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
the largest parameter (the embedding, on small models); only the moments are sharded: every
rank keeps the main parameters of its whole model shard (megatron-core's distributed
optimizer shards those too); the updated parameters are broadcast one tensor at a time
(no bucketing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.optim.adam import adam

#: The attribute holding a main parameter's gradient when its dtype may differ from the parameter's.
MAIN_GRAD = "main_grad"


def main_grad(param: torch.Tensor) -> torch.Tensor | None:
    """The gradient :class:`MainAdamW` applies to ``param``: its ``main_grad`` where set, else its ``grad``."""
    grad: torch.Tensor | None = getattr(param, MAIN_GRAD, None)
    return grad if grad is not None else param.grad


def set_main_grad(param: torch.Tensor, grad: torch.Tensor | None) -> None:
    """Set (or, with None, clear) the gradient :class:`MainAdamW` applies to ``param``."""
    setattr(param, MAIN_GRAD, grad)


class MainAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, torch's defaults) with gradients and moments in dtypes of their own.

    ``exp_avg_dtype`` / ``exp_avg_sq_dtype`` are hyperparameters of each group (so torch's
    ZeRO wrapper passes them on to its local optimizer and checkpoints record them).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        exp_avg_dtype: torch.dtype = torch.float32,
        exp_avg_sq_dtype: torch.dtype = torch.float32,
        foreach: bool = True,
    ) -> None:
        for name, dtype in (("exp_avg_dtype", exp_avg_dtype), ("exp_avg_sq_dtype", exp_avg_sq_dtype)):
            if not dtype.is_floating_point:
                raise ValueError(f"MainAdamW: {name} must be a floating-point dtype, not {dtype}")
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "exp_avg_dtype": exp_avg_dtype,
            "exp_avg_sq_dtype": exp_avg_sq_dtype,
            "foreach": foreach,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One AdamW step of every parameter that has a gradient (see the module docstring for the dtypes)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            hyper = {
                "amsgrad": False,
                "beta1": beta1,
                "beta2": beta2,
                "lr": group["lr"],
                "weight_decay": group["weight_decay"],
                "eps": group["eps"],
                "maximize": False,
                "decoupled_weight_decay": True,
            }
            params: list[torch.Tensor] = []
            grads: list[torch.Tensor] = []
            exp_avgs: list[torch.Tensor] = []
            exp_avg_sqs: list[torch.Tensor] = []
            steps: list[torch.Tensor] = []
            mixed: list[tuple[torch.Tensor, ...]] = []
            for param in group["params"]:
                grad = main_grad(param)
                if grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)  # on the host, as torch AdamW's
                    state["exp_avg"] = torch.zeros_like(param, dtype=group["exp_avg_dtype"])
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=group["exp_avg_sq_dtype"])
                tensors = (param, grad, state["exp_avg"], state["exp_avg_sq"], state["step"])
                if len({t.dtype for t in tensors[:4]}) == 1:
                    for bucket, tensor in zip((params, grads, exp_avgs, exp_avg_sqs, steps), tensors, strict=True):
                        bucket.append(tensor)
                else:
                    mixed.append(tensors)
            if params:
                adam(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=group["foreach"], **hyper)
            for param, grad, exp_avg, exp_avg_sq, step in mixed:
                wide = [t.float() for t in (param, grad, exp_avg, exp_avg_sq)]  # float32 (the tensor itself if so)
                adam([wide[0]], [wide[1]], [wide[2]], [wide[3]], [], [step], foreach=False, **hyper)
                for own, computed in ((param, wide[0]), (exp_avg, wide[2]), (exp_avg_sq, wide[3])):
                    if computed is not own:
                        own.copy_(computed)
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's loader, then the moments back in the group's dtypes (it casts them to the parameter's)."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            for param in group["params"]:
                state = self.state.get(param)
                if state:
                    state["exp_avg"] = state["exp_avg"].to(group["exp_avg_dtype"])
                    state["exp_avg_sq"] = state["exp_avg_sq"].to(group["exp_avg_sq_dtype"])


def build_optimizer(
    params: Iterable[torch.Tensor],
    *,
    lr: float,
    weight_decay: float,
    shard_group: dist.ProcessGroup | None = None,
    exp_avg_dtype: torch.dtype = torch.float32,
    exp_avg_sq_dtype: torch.dtype = torch.float32,
) -> torch.optim.Optimizer:
    """:class:`MainAdamW` over ``params``; its states sharded over ``shard_group`` when it has more than one rank."""
    hyper: dict[str, Any] = {
        "lr": lr,
        "weight_decay": weight_decay,
        "exp_avg_dtype": exp_avg_dtype,
        "exp_avg_sq_dtype": exp_avg_sq_dtype,
        "foreach": True,
    }
    if shard_group is None or dist.get_world_size(shard_group) == 1:
        return MainAdamW(params, **hyper)
    return ZeroRedundancyOptimizer(
        list(params),
        optimizer_class=MainAdamW,
        process_group=shard_group,
        # False: bucket views would re-point every parameter's storage, and the warm start's optimizer is a second
        # ZeRO over the same parameters (the first one's buckets would then no longer be the parameters)
        parameters_as_bucket_view=False,
        **hyper,
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
