"""HF <-> megatron-core weight conversion: exact round trips, tensor-parallel shards, model support checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from telescope_megatron.convert import hf_to_megatron, megatron_to_hf, shard, stream_hf_weights, unshard
from telescope_megatron.model import ModelShape, UnsupportedModelError, check_supported
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
    fc1 = full["decoder.layers.0.mlp.linear_fc1.weight"]
    gate, up = fc1.chunk(2)
    rows = gate.shape[0] // tp
    part = shard("decoder.layers.0.mlp.linear_fc1.weight", fc1, 0, tp)
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


def test_stream_yields_hf_order_and_rejects_gaps(tiny_model: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    shape = ModelShape.from_hf(model.config)
    full = hf_to_megatron(dict(model.state_dict()), shape)
    order = [n for n, _ in model.named_parameters()]
    streamed = list(stream_hf_weights(list(full), full.__getitem__, shape, order))
    assert [n for n, _ in streamed] == order
    with pytest.raises(KeyError, match="missing"):
        list(stream_hf_weights(list(full)[:-1], full.__getitem__, shape, order))


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
