"""Mixture-of-experts models (Qwen3-MoE) and expert parallelism: config mapping, expert names, gathers, norm.

Design. A Qwen3-MoE decoder layer's MLP is either the sparse block (a router and
``num_experts`` SwiGLU experts of ``moe_intermediate_size``) or, for the layers in
``mlp_only_layers`` or off the ``decoder_sparse_step`` grid, a dense MLP of
``intermediate_size``. :func:`sparse_layers` reads which is which exactly as
``Qwen3MoeDecoderLayer`` does, and :func:`telescope_megatron.model.build_model` gives
each layer megatron-core's MoE spec (``MoELayer`` with ``SequentialMLP`` experts:
plain per-expert ``linear_fc1``/``linear_fc2``, no grouped GEMM, so it runs on the
CPU) or its dense spec accordingly.

Routing (:func:`moe_config_fields`) is set to compute what ``Qwen3MoeTopKRouter``
computes: router logits ``x W^T`` (no bias), softmax over all experts, the top
``num_experts_per_tok``; with ``norm_topk_prob`` the chosen probabilities are
renormalised to sum to 1, which megatron-core computes as a softmax over the top-k
*logits* (``moe_router_pre_softmax=False``: the same numbers up to rounding, since
softmax is monotone and ``softmax(top-k logits) = top-k probs / their sum``);
without it, megatron-core's ``moe_router_pre_softmax=True`` (softmax over all, then
top-k) is HF's computation itself. No capacity factor (no token is dropped), no
input jitter, no z-loss, and no load-balancing loss (``moe_aux_loss_coeff=0``,
``moe_router_load_balancing_type="none"``): the HF model's forward adds its
auxiliary loss only when given ``labels`` with ``output_router_logits``, and the
trainers compute their loss from the logits, so neither backend trains with it.

Expert parallelism (``megatron_expert_parallel_size`` = EP): each expert-parallel
rank holds ``num_experts / EP`` consecutive experts (megatron-core names them
``mlp.experts.local_experts.<i>`` from 0 on every rank); tokens go to the rank of
their expert and back by megatron-core's all-to-all token dispatcher, which takes
rows of different lengths on different ranks (the allgather dispatcher does not).
Expert tensor parallelism equals ``megatron_tensor_parallel_size`` (megatron-core's
default): each expert's ``linear_fc1``/``linear_fc2`` is split as the dense MLP's.
:func:`global_expert_name` turns a local expert index into the model-wide one that
the weight conversion (:mod:`telescope_megatron.convert`) uses; :func:`gather_experts`
puts a layer's experts back together from the expert-parallel ranks (the weight
stream), and :func:`expert_gradient_squares` is the experts' share of the gradient
norm (the backend sums the expert gradients over the expert-data-parallel group first).

Limits: the Qwen3-MoE family only (no shared experts; other MoE families are refused
by model type); top-1 routing with ``norm_topk_prob`` is refused (megatron-core
requires the pre-softmax there, which would not renormalise); MoE with tensor
parallelism trains only with ``megatron_sequence_parallel`` (megatron-core's rule).
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.distributed as dist

#: megatron-core's name of one local expert's parameter (after the model-wide layer prefix).
_LOCAL_EXPERT = re.compile(r"^(decoder\.layers\.\d+\.mlp\.experts\.local_experts\.)(\d+)(\..+)$")


def num_experts(hf_config: Any) -> int:
    """The number of routed experts of a Hugging Face config (0 for a dense model)."""
    return int(getattr(hf_config, "num_experts", None) or 0)


def sparse_layers(hf_config: Any) -> tuple[int, ...]:
    """The layers whose MLP is the routed-experts block, as ``Qwen3MoeDecoderLayer`` decides."""
    experts = num_experts(hf_config)
    if not experts:
        return ()
    step = int(getattr(hf_config, "decoder_sparse_step", 1) or 1)
    dense = set(getattr(hf_config, "mlp_only_layers", None) or [])
    return tuple(
        layer for layer in range(int(hf_config.num_hidden_layers)) if layer not in dense and (layer + 1) % step == 0
    )


def moe_problem(hf_config: Any) -> str | None:
    """What in an MoE config the megatron model cannot compute exactly (None: nothing, or a dense model)."""
    if not num_experts(hf_config):
        return None
    topk = int(hf_config.num_experts_per_tok)
    if topk == 1 and bool(getattr(hf_config, "norm_topk_prob", False)):
        return (
            "num_experts_per_tok=1 with norm_topk_prob=true is not supported (megatron-core routes top-1 "
            "with the softmax before the top-k, which does not renormalise)"
        )
    if topk > num_experts(hf_config):
        return f"num_experts_per_tok ({topk}) is larger than num_experts ({num_experts(hf_config)})"
    return None


def moe_config_fields(hf_config: Any, *, expert_parallel_size: int, num_layers: int) -> dict[str, Any]:
    """The ``TransformerConfig`` fields of an MoE model (empty for a dense model); see the module doc."""
    if not num_experts(hf_config):
        return {}
    sparse = set(sparse_layers(hf_config))
    return {
        "num_moe_experts": num_experts(hf_config),
        "moe_ffn_hidden_size": int(hf_config.moe_intermediate_size),
        "moe_layer_freq": [int(layer in sparse) for layer in range(num_layers)],
        "moe_router_topk": int(hf_config.num_experts_per_tok),
        "moe_router_score_function": "softmax",
        "moe_router_pre_softmax": not bool(getattr(hf_config, "norm_topk_prob", False)),
        "moe_router_load_balancing_type": "none",
        "moe_aux_loss_coeff": 0.0,
        "moe_z_loss_coeff": None,
        "moe_input_jitter_eps": None,
        "moe_expert_capacity_factor": None,
        "moe_grouped_gemm": False,
        "moe_permute_fusion": False,
        "moe_router_fusion": False,
        "expert_model_parallel_size": expert_parallel_size,
    }


def is_expert_parameter(name: str) -> bool:
    """Whether megatron parameter ``name`` belongs to one expert (not replicated over expert-parallel ranks)."""
    return ".mlp.experts.local_experts." in name


def global_expert_name(name: str, ep_rank: int, num_local_experts: int) -> str:
    """A (model-wide layer) parameter name with its local expert index made model-wide."""
    match = _LOCAL_EXPERT.match(name)
    if match is None or ep_rank == 0:
        return name
    return f"{match.group(1)}{int(match.group(2)) + ep_rank * num_local_experts}{match.group(3)}"


def gather_experts(local: torch.Tensor) -> torch.Tensor:
    """A layer's experts ``[E, ...]`` from this rank's ``[E / EP, ...]`` (all-gathered over the expert-parallel group).

    Expert-parallel rank ``r`` holds the ``r``-th run of consecutive experts, so the
    ranks' stacks in rank order are the experts in order. Collective.
    """
    from megatron.core import parallel_state

    group = parallel_state.get_expert_model_parallel_group()
    size = dist.get_world_size(group)
    if size == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local.contiguous(), group=group)
    return torch.cat(parts)


def expert_gradient_squares(grads: list[torch.Tensor]) -> torch.Tensor:
    """The squared norm of every expert gradient of the model: each rank's shards, each counted once. Collective.

    The ranks of an expert tensor x expert x pipeline-parallel group hold different
    shards of different experts (of different stages), so their sums add up; the
    expert-data-parallel copies are equal and are not summed again.
    """
    from megatron.core import parallel_state

    squares = torch.zeros((), dtype=torch.float32, device=grads[0].device)
    for grad in grads:
        squares += grad.detach().float().pow(2).sum()
    group = parallel_state.get_expert_tensor_model_pipeline_parallel_group()
    if dist.get_world_size(group) > 1:
        dist.all_reduce(squares, group=group)
    return squares
