r"""Weight conversion Hugging Face <-> megatron-core (``GPTModel``, local layer spec), with tensor-parallel shards.

Why a small mapping of our own rather than Megatron-Bridge: Megatron-Bridge is a
large package (it pulls Transformer Engine, ModelOpt and its own model providers),
is not installable next to a CPU torch without them, and converts whole models at
once; the families we support need a dozen name rules and three layout rules,
which fit in this module, run on the CPU, convert one layer at a time (so the
weight stream never holds the whole model), and are tested to round-trip exactly.

Names (``L`` = layer index):

==================================================  =============================================
megatron-core                                       Hugging Face
==================================================  =============================================
embedding.word_embeddings.weight                    model.embed_tokens.weight
decoder.layers.L.input_layernorm.weight             model.layers.L.input_layernorm.weight
decoder.layers.L.self_attention.linear_qkv.{w,b}    model.layers.L.self_attn.{q,k,v}_proj.{w,b}
decoder.layers.L.self_attention.{q,k}_layernorm.w   model.layers.L.self_attn.{q,k}_norm.weight
decoder.layers.L.self_attention.linear_proj.weight  model.layers.L.self_attn.o_proj.weight
decoder.layers.L.pre_mlp_layernorm.weight           model.layers.L.post_attention_layernorm.weight
decoder.layers.L.mlp.linear_fc1.weight              model.layers.L.mlp.{gate,up}_proj.weight
decoder.layers.L.mlp.linear_fc2.weight              model.layers.L.mlp.down_proj.weight
decoder.layers.L.mlp.router.weight (MoE)            model.layers.L.mlp.gate.weight
decoder.layers.L.mlp.experts.linear_fc1.weight *    model.layers.L.mlp.experts.gate_up_proj
decoder.layers.L.mlp.experts.linear_fc2.weight *    model.layers.L.mlp.experts.down_proj
decoder.final_layernorm.weight                      model.norm.weight
output_layer.weight (untied models only)            lm_head.weight
==================================================  =============================================

\* Experts (MoE layers, :mod:`telescope_megatron.moe`): transformers 5 keeps each
layer's experts as two 3-D tensors, ``gate_up_proj [E, 2 I, H]`` (each expert's
``[gate; up]``) and ``down_proj [E, H, I]``. The *stacked* megatron names above
stand for megatron-core's per-expert parameters
``mlp.experts.local_experts.<e>.linear_fc{1,2}.weight`` stacked along a first
expert dimension (``e`` model-wide, see :func:`expert_of`); expert ``e``'s
``linear_fc1`` is exactly ``gate_up_proj[e]`` and its ``linear_fc2`` ``down_proj[e]``.
The conversion works on the stacks; the backend loads expert ``e`` from row ``e``
and, to stream, stacks its local experts and gathers the other expert-parallel
ranks' (each rank holds ``E / EP`` consecutive experts).

Layouts: ``linear_qkv`` holds, for each key/value group, that group's query heads,
then its key head, then its value head (so a contiguous split over tensor-parallel
ranks gives each rank whole groups); ``linear_fc1`` (dense or one expert's) holds
``[gate; up]`` on *each* rank, so its full tensor is the ranks' gate shards then
their up shards.

Tensor parallelism: :data:`PARTITION_DIMS` says which weights are split and along
which dimension (an expert's ``linear_fc1``/``linear_fc2`` as the dense MLP's);
everything else (the norms, the router) is replicated.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import torch

from telescope_megatron.model import ModelShape

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^(decoder\.layers\.\d+\.mlp\.experts\.)local_experts\.(\d+)\.(linear_fc[12]\.weight)$")

#: megatron-core name suffix -> the dimension tensor parallelism splits (absent: replicated).
PARTITION_DIMS: dict[str, int] = {
    "embedding.word_embeddings.weight": 0,
    "output_layer.weight": 0,
    "self_attention.linear_qkv.weight": 0,
    "self_attention.linear_qkv.bias": 0,
    "self_attention.linear_proj.weight": 1,
    "mlp.linear_fc1.weight": 0,
    "mlp.linear_fc2.weight": 1,
    "mlp.experts.local_experts.*.linear_fc1.weight": 0,
    "mlp.experts.local_experts.*.linear_fc2.weight": 1,
}

_LAYER_PLAIN = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.router.weight": "mlp.gate.weight",
    "mlp.experts.linear_fc1.weight": "mlp.experts.gate_up_proj",  # stacked experts
    "mlp.experts.linear_fc2.weight": "mlp.experts.down_proj",
}
_GLOBAL_PLAIN = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}


def partition_dim(name: str) -> int | None:
    """The dimension along which tensor parallelism splits megatron parameter ``name`` (None: replicated)."""
    match = _LAYER.match(name)
    suffix = match.group(2) if match else name
    return PARTITION_DIMS.get(re.sub(r"local_experts\.\d+\.", "local_experts.*.", suffix))


def expert_of(name: str) -> tuple[str, int] | None:
    """For one expert's parameter (model-wide expert index): its stacked name and its row; else None."""
    match = _EXPERT.match(name)
    return None if match is None else (match.group(1) + match.group(3), int(match.group(2)))


# ------------------------------------------------------------------ full tensors


def _merge_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    return merge_qkv_groups(q, k, v, shape.num_query_groups, shape.head_dim)


def merge_qkv_groups(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int, head_dim: int) -> torch.Tensor:
    """``linear_qkv``'s layout of ``groups`` consecutive key/value groups: each group's q rows, k rows, v rows."""
    rest = q.shape[1:]
    q = q.reshape(groups, -1, *rest)
    k = k.reshape(groups, head_dim, *rest)
    v = v.reshape(groups, head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def hf_source(name: str) -> str | None:
    """The one Hugging Face tensor that megatron tensor ``name`` is, renamed (stacked experts: the 3-D tensor);
    None for the merged ones (``linear_qkv``, a dense ``linear_fc1``) and unknown names."""
    if name in _GLOBAL_PLAIN:
        return _GLOBAL_PLAIN[name]
    match = _LAYER.match(name)
    if match is None or match.group(2) not in _LAYER_PLAIN:
        return None
    return f"model.layers.{match.group(1)}.{_LAYER_PLAIN[match.group(2)]}"


def _split_qkv(qkv: torch.Tensor, shape: ModelShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, d = shape.num_query_groups, shape.head_dim
    per_group = shape.num_attention_heads // groups
    rest = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per_group + 2) * d, *rest)
    q, k, v = torch.split(grouped, [per_group * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def hf_to_megatron(hf: dict[str, torch.Tensor], shape: ModelShape) -> dict[str, torch.Tensor]:
    """Full (unsharded) megatron-core tensors of a Hugging Face state dict (tied ``lm_head`` dropped)."""
    out = {m: hf[h] for m, h in _GLOBAL_PLAIN.items() if not (m == "output_layer.weight" and shape.tied_embeddings)}
    for layer in range(shape.num_layers):
        src, dst = f"model.layers.{layer}.", f"decoder.layers.{layer}."
        for m, h in _LAYER_PLAIN.items():
            if src + h in hf:
                out[dst + m] = hf[src + h]
        attn = src + "self_attn."
        out[dst + "self_attention.linear_qkv.weight"] = _merge_qkv(
            hf[attn + "q_proj.weight"], hf[attn + "k_proj.weight"], hf[attn + "v_proj.weight"], shape
        )
        if shape.qkv_bias:
            out[dst + "self_attention.linear_qkv.bias"] = _merge_qkv(
                hf[attn + "q_proj.bias"], hf[attn + "k_proj.bias"], hf[attn + "v_proj.bias"], shape
            )
        if not shape.is_sparse(layer):
            out[dst + "mlp.linear_fc1.weight"] = torch.cat(
                [hf[src + "mlp.gate_proj.weight"], hf[src + "mlp.up_proj.weight"]], dim=0
            )
    return out


def megatron_to_hf(name: str, tensor: torch.Tensor, shape: ModelShape) -> list[tuple[str, torch.Tensor]]:
    """The Hugging Face tensors of one full megatron-core tensor (q/k/v and gate/up are split)."""
    if name in _GLOBAL_PLAIN:
        return [(_GLOBAL_PLAIN[name], tensor)]
    match = _LAYER.match(name)
    if match is None:
        raise KeyError(f"no Hugging Face name for megatron parameter {name!r}")
    prefix, suffix = f"model.layers.{match.group(1)}.", match.group(2)
    if suffix in _LAYER_PLAIN:
        return [(prefix + _LAYER_PLAIN[suffix], tensor)]
    if suffix.startswith("self_attention.linear_qkv."):
        kind = suffix.rsplit(".", 1)[1]
        q, k, v = _split_qkv(tensor, shape)
        return [(f"{prefix}self_attn.{p}_proj.{kind}", t) for p, t in zip("qkv", (q, k, v), strict=True)]
    if suffix == "mlp.linear_fc1.weight":
        gate, up = tensor.chunk(2, dim=0)
        return [(prefix + "mlp.gate_proj.weight", gate), (prefix + "mlp.up_proj.weight", up)]
    raise KeyError(f"no Hugging Face name for megatron parameter {name!r}")


# ------------------------------------------------------------- tensor parallel


def shard(name: str, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """This tensor-parallel rank's part of the full megatron tensor ``name``."""
    dim = partition_dim(name)
    if dim is None or size == 1:
        return full
    if full.shape[dim] % size:
        raise ValueError(f"{name}: dimension {dim} ({full.shape[dim]}) is not divisible by the TP size {size}")
    if name.endswith("linear_fc1.weight"):  # dense or one expert's: [gate; up] on each rank
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]], dim=0)
    return full.chunk(size, dim=dim)[rank]


def unshard(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """The full megatron tensor ``name`` from every tensor-parallel rank's part (in rank order)."""
    dim = partition_dim(name)
    if dim is None or len(parts) == 1:
        return parts[0]
    if name.endswith("linear_fc1.weight"):  # dense or one expert's: [gate; up] on each rank
        halves = [p.chunk(2, dim=0) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(parts, dim=dim)


def stream_hf_weights(
    megatron_names: list[str],
    full_tensor: Callable[[str], torch.Tensor],
    shape: ModelShape,
    hf_order: list[str],
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield Hugging Face ``(name, tensor)`` in ``hf_order``, gathering one megatron tensor at a time.

    ``full_tensor(name)`` returns the full tensor of one megatron parameter (a
    collective under tensor parallelism, so every rank calls it in the same order).
    Tensors are converted layer by layer: at most one layer's worth is held back to
    put its q/k/v and gate/up in the Hugging Face order.
    """
    ready: dict[str, torch.Tensor] = {}
    position = 0
    for name in megatron_names:
        for hf_name, tensor in megatron_to_hf(name, full_tensor(name), shape):
            ready[hf_name] = tensor
        while position < len(hf_order) and hf_order[position] in ready:
            yield hf_order[position], ready.pop(hf_order[position])
            position += 1
    if ready or position != len(hf_order):
        missing = hf_order[position:]
        raise KeyError(
            f"weights not produced in the Hugging Face order: missing {missing[:5]}, extra {list(ready)[:5]}"
        )
