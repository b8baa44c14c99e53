"""HF <-> megatron-core weight conversion: exact round trips, tensor- and expert-parallel shards, support checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from telescope_megatron.convert import (
    expert_of,
    hf_to_megatron,
    megatron_to_hf,
    partition_dim,
    shard,
    stream_hf_weights,
    unshard,
)
from telescope_megatron.model import ModelShape, UnsupportedModelError, check_supported
from telescope_megatron.moe import global_expert_name, sparse_layers
from transformers import AutoConfig, AutoModelForCausalLM


def test_round_trip_is_exact(family_model: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(family_model, dtype=torch.float32)
    shape = ModelShape.from_hf(model.config)
    hf = dict(model.state_dict())
    full = hf_to_megatron(hf, shape)
    back = dict(pair for name, tensor in full.items() for pair in megatron_to_hf(name, tensor, shape))
    expected = {k: v for k, v in hf.items() if not (shape.tied_embeddings and k == "lm_head.weight")}
    assert sorted(back) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(back[name], tensor), name


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_shards_reassemble_exactly(family_model: Path, tp: int) -> None:
    model = AutoModelForCausalLM.from_pretrained(family_model, dtype=torch.float32)
    shape = ModelShape.from_hf(model.config)
    full = hf_to_megatron(dict(model.state_dict()), shape)
    for name, tensor in full.items():
        parts = [shard(name, tensor, r, tp) for r in range(tp)]
        assert torch.equal(unshard(name, parts), tensor), name
    # each rank's fc1 shard is [gate_r; up_r]: rank 0's first rows are gate rows, not up rows
    # (the MoE models' experts: test_expert_shards_reassemble_exactly)
    for name in [n for n in full if n.endswith("mlp.linear_fc1.weight")]:
        gate, up = full[name].chunk(2)
        rows = gate.shape[0] // tp
        part = shard(name, full[name], 0, tp)
        assert torch.equal(part[:rows], gate[:rows]) and torch.equal(part[rows:], up[:rows])


def test_qkv_layout_groups_queries_with_their_key_and_value(tiny_model: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    shape = ModelShape.from_hf(model.config)
    full = hf_to_megatron(dict(model.state_dict()), shape)
    qkv = full["decoder.layers.0.self_attention.linear_qkv.weight"]
    d, per_group = shape.head_dim, shape.num_attention_heads // shape.num_query_groups
    attn = "model.layers.0.self_attn."
    hf = model.state_dict()
    group1 = qkv[(per_group + 2) * d : 2 * (per_group + 2) * d]
    assert torch.equal(group1[: per_group * d], hf[attn + "q_proj.weight"][per_group * d : 2 * per_group * d])
    assert torch.equal(group1[per_group * d : (per_group + 1) * d], hf[attn + "k_proj.weight"][d : 2 * d])
    assert torch.equal(group1[(per_group + 1) * d :], hf[attn + "v_proj.weight"][d : 2 * d])


def test_stream_yields_hf_order_and_rejects_gaps(family_model: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(family_model, dtype=torch.float32)
    shape = ModelShape.from_hf(model.config)
    full = hf_to_megatron(dict(model.state_dict()), shape)
    order = [n for n, _ in model.named_parameters()]
    streamed = list(stream_hf_weights(list(full), full.__getitem__, shape, order))
    assert [n for n, _ in streamed] == order
    with pytest.raises(KeyError, match="missing"):
        list(stream_hf_weights(list(full)[:-1], full.__getitem__, shape, order))


@pytest.mark.parametrize(("tp", "ep"), [(1, 2), (2, 2), (2, 4), (1, 4)])
def test_expert_shards_reassemble_exactly(moe_model: Path, tp: int, ep: int) -> None:
    """Each expert-parallel rank's experts (local index -> model-wide), split over TP, give back HF's 3-D tensors."""
    model = AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32)
    shape = ModelShape.from_hf(model.config)
    hf = dict(model.state_dict())
    full = hf_to_megatron(hf, shape)
    local = shape.num_experts // ep
    for layer in shape.sparse_layers:
        for kind, hf_kind in (("linear_fc1", "gate_up_proj"), ("linear_fc2", "down_proj")):
            stacked = f"decoder.layers.{layer}.mlp.experts.{kind}.weight"
            assert torch.equal(full[stacked], hf[f"model.layers.{layer}.mlp.experts.{hf_kind}"])
            rows = []
            for ep_rank in range(ep):
                for i in range(local):
                    name = global_expert_name(
                        f"decoder.layers.{layer}.mlp.experts.local_experts.{i}.{kind}.weight", ep_rank, local
                    )
                    assert expert_of(name) == (stacked, ep_rank * local + i)
                    assert partition_dim(name) == (0 if kind == "linear_fc1" else 1)
                    parts = [shard(name, full[stacked][ep_rank * local + i], r, tp) for r in range(tp)]
                    rows.append(unshard(name, parts))
            assert torch.equal(torch.stack(rows), full[stacked])
    # an expert's fc1 is HF's gate_up_proj[e] = [gate; up]; TP rank 0 holds the first gate rows, then the first up rows
    last = shape.num_experts - 1
    gate_up = hf["model.layers.0.mlp.experts.gate_up_proj"][last]
    half = gate_up.shape[0] // 2
    part = shard(f"decoder.layers.0.mlp.experts.local_experts.{last}.linear_fc1.weight", gate_up, 0, 2)
    assert torch.equal(part[: half // 2], gate_up[: half // 2]) and torch.equal(
        part[half // 2 :], gate_up[half:][: half // 2]
    )
    assert partition_dim("decoder.layers.0.mlp.router.weight") is None  # replicated
    assert torch.equal(full["decoder.layers.0.mlp.router.weight"], hf["model.layers.0.mlp.gate.weight"])


def test_sparse_layers_follow_the_hf_decoder_layers(family_model: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(family_model, dtype=torch.float32)
    sparse = tuple(i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "experts"))
    assert sparse_layers(model.config) == sparse
    config = AutoConfig.from_pretrained(family_model)
    if sparse:  # the decoder_sparse_step grid, less mlp_only_layers
        config.decoder_sparse_step, config.mlp_only_layers = 2, [3]
        config.num_hidden_layers = 6
        assert sparse_layers(config) == (1, 5)


def test_moe_routing_megatron_cannot_match_is_refused(moe_model: Path) -> None:
    config = AutoConfig.from_pretrained(moe_model)
    config.num_experts_per_tok, config.norm_topk_prob = 1, True
    with pytest.raises(UnsupportedModelError, match="num_experts_per_tok=1 with norm_topk_prob=true"):
        check_supported(config)
    config.norm_topk_prob = False  # top-1 without renormalising: megatron-core's pre-softmax routing
    check_supported(config)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
        ({"use_sliding_window": True}, "sliding-window"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "rope scaling 'yarn'"),
    ],
)
def test_unsupported_models_are_refused_by_name(tiny_model: Path, changes: dict, message: str) -> None:
    config = AutoConfig.from_pretrained(tiny_model)
    for key, value in changes.items():
        setattr(config, key, value)
    with pytest.raises(UnsupportedModelError, match=message):
        check_supported(config)
