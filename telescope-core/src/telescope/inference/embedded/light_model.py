"""A checkpoint's weights in the module tree the compact forward reads, without transformers' modeling code.

Why
---
The compact forward (:class:`~.compact.CompactDecoder`) reads a causal LM's parameters,
a few config fields and a RoPE table; it never calls the Hugging Face modules. Loading
the model through ``AutoModelForCausalLM`` still imports ``transformers.modeling_utils``,
which on transformers 5 pulls in ``torch._dynamo``, the quantizers and the image
transforms: about 2 s of CPU in every inference server's start (on a 2-core machine,
time the trainer's start shares), for a model of a few megabytes. This module builds
the same parameter tree (same names, so weight updates and the state dict are
unchanged; tied embeddings share one parameter) straight from the safetensors files,
with the config from ``AutoConfig`` (its per-family defaults) and the generation
config from ``GenerationConfig``, both light.

Limits
------
:func:`load_light_model` returns ``None`` with the reason (and the engine then loads
through transformers) unless: the compact forward supports the config
(:func:`~.compact.unsupported_reason`), the RoPE is static and covers the whole head,
there is no quantization config, the weights are safetensors (one file or an index),
and the files hold exactly the tensors the family's modules would (q/k/v biases
where the family has them, no others). Weights are cast to the asked dtype; nothing
is initialised at random. The tree has no ``forward``: only the compact runner can
use it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from telescope.inference.embedded.compact import unsupported_reason

log = logging.getLogger(__name__)

#: Checkpoint tensors that are not parameters (old checkpoints saved the RoPE buffer).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class LightRotary(nn.Module):
    """RoPE's cos/sin as the Hugging Face rotary module computes them (float32, then the input dtype)."""

    inv_freq: torch.Tensor
    attention_scaling: float

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = attention_scaling

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


class _Weights(nn.Module):
    """A module that only holds parameters (a linear layer's ``weight``/``bias``, a norm's ``weight``)."""

    def __init__(self, **tensors: torch.Tensor | None) -> None:
        super().__init__()
        for name, tensor in tensors.items():
            self.register_parameter(name, None if tensor is None else nn.Parameter(tensor, requires_grad=False))


class _Norm(_Weights):
    """An RMSNorm's weight and epsilon (q_norm / k_norm: the compact forward reads ``variance_epsilon``)."""

    def __init__(self, weight: torch.Tensor | None, eps: float) -> None:
        super().__init__(weight=weight)
        self.variance_epsilon = eps


class _Attention(nn.Module):
    """The attention's projections, its head size and score scaling."""

    def __init__(self, config: Any, get: Any) -> None:
        super().__init__()
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            self.add_module(proj, _Weights(weight=get(f"self_attn.{proj}.weight"), bias=get(f"self_attn.{proj}.bias")))
        self.head_dim = head_dim(config)
        self.scaling = self.head_dim**-0.5
        if get("self_attn.q_norm.weight") is not None:
            eps = float(config.rms_norm_eps)
            self.q_norm = _Norm(get("self_attn.q_norm.weight"), eps)
            self.k_norm = _Norm(get("self_attn.k_norm.weight"), eps)


class LightCausalLM(nn.Module):
    """``model.embed_tokens / layers / norm / rotary_emb``, ``lm_head``, ``config``, ``generation_config``."""

    def __init__(self, config: Any, generation_config: Any, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.config = config
        self.generation_config = generation_config
        inv_freq, scaling = rope_parameters(config)
        self.model = nn.Module()
        self.model.embed_tokens = _Weights(weight=tensors["model.embed_tokens.weight"])
        self.model.layers = nn.ModuleList(_layer(config, tensors, i) for i in range(config.num_hidden_layers))
        self.model.norm = _Weights(weight=tensors["model.norm.weight"])
        self.model.rotary_emb = LightRotary(inv_freq, scaling)
        if config.tie_word_embeddings:
            self.lm_head = nn.Module()
            self.lm_head.weight = self.model.embed_tokens.weight  # one parameter, two names (as tied in HF)
        else:
            self.lm_head = _Weights(weight=tensors["lm_head.weight"])


def head_dim(config: Any) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def _layer(config: Any, tensors: dict[str, torch.Tensor], i: int) -> nn.Module:
    prefix = f"model.layers.{i}."

    def get(name: str) -> torch.Tensor | None:
        return tensors.get(prefix + name)

    layer = nn.Module()
    layer.self_attn = _Attention(config, get)
    mlp = nn.Module()
    for proj in ("gate_proj", "up_proj", "down_proj"):
        setattr(mlp, proj, _Weights(weight=get(f"mlp.{proj}.weight")))
    layer.mlp = mlp
    layer.input_layernorm = _Weights(weight=get("input_layernorm.weight"))
    layer.post_attention_layernorm = _Weights(weight=get("post_attention_layernorm.weight"))
    return layer


def rope_parameters(config: Any) -> tuple[torch.Tensor, float]:
    """``(inv_freq, attention_scaling)``: the default RoPE here, the others by transformers' own functions."""
    rope = dict(config.rope_parameters or {})
    rope_type = rope.get("rope_type", "default")
    if rope_type == "default":
        dim = head_dim(config)
        return 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config)
    return inv_freq, float(scaling)


def expected_names(config: Any, qkv_bias: bool, o_bias: bool) -> set[str]:
    """The tensors the family's modules hold (``lm_head.weight`` only when not tied)."""
    per_layer = [f"self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    per_layer += [f"mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")]
    per_layer += ["input_layernorm.weight", "post_attention_layernorm.weight"]
    if qkv_bias:
        per_layer += [f"self_attn.{p}.bias" for p in ("q_proj", "k_proj", "v_proj")]
    if o_bias:
        per_layer.append("self_attn.o_proj.bias")
    if config.model_type == "qwen3":
        per_layer += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
    names = {f"model.layers.{i}.{n}" for i in range(config.num_hidden_layers) for n in per_layer}
    names |= {"model.embed_tokens.weight", "model.norm.weight"}
    if not config.tie_word_embeddings:
        names.add("lm_head.weight")
    return names


def _family_biases(config: Any) -> tuple[bool, bool]:
    """(q/k/v bias, o_proj bias) as the family's attention module creates them."""
    if config.model_type == "qwen2":
        return True, False
    if config.model_type == "mistral":
        return False, False
    bias = bool(getattr(config, "attention_bias", False))  # llama, qwen3
    return bias, bias


def _read_safetensors(path: Path) -> dict[str, torch.Tensor] | None:
    from safetensors.torch import load_file

    single = path / "model.safetensors"
    if single.is_file():
        return load_file(str(single))
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return None
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        tensors.update(load_file(str(path / shard)))
    return tensors


def load_light_model(model_path: str, dtype: torch.dtype) -> tuple[LightCausalLM | None, str]:
    """The light tree of the checkpoint at ``model_path`` and ``""``, or ``None`` and why not (module doc)."""
    from transformers import AutoConfig, GenerationConfig

    path = Path(model_path)
    if not (path / "config.json").is_file():
        return None, "not a local checkpoint folder"
    config = AutoConfig.from_pretrained(model_path)
    reason = unsupported_reason(SimpleNamespace(config=config))
    if reason is not None:
        return None, reason
    if getattr(config, "quantization_config", None):
        return None, "the checkpoint is quantized"
    rope = dict(config.rope_parameters or {})
    if rope.get("rope_type", "default") == "default" and "rope_theta" not in rope:
        return None, "the config has no rope_theta"
    if float(getattr(config, "partial_rotary_factor", 1.0) or 1.0) != 1.0:
        return None, "RoPE covers part of the head"
    tensors = _read_safetensors(path)
    if tensors is None:
        return None, "no safetensors weights"
    tensors = {k: v for k, v in tensors.items() if not k.endswith(_IGNORED_SUFFIXES)}
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)  # tied: the embedding's weight serves (as in transformers)
    expected = expected_names(config, *_family_biases(config))
    if set(tensors) != expected:
        missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        return None, f"the weights differ from the family's modules (missing {missing[:3]}, unexpected {extra[:3]})"
    tensors = {k: v.to(dtype) for k, v in tensors.items()}
    try:
        generation_config = GenerationConfig.from_pretrained(model_path)
    except OSError:  # no generation_config.json: transformers derives it from the model's config
        generation_config = GenerationConfig.from_model_config(config)
    return LightCausalLM(config, generation_config, tensors), ""


def load_engine_model(model_path: str, dtype: torch.dtype, forward: str) -> Any:
    """The light tree where the compact forward will run the model (``forward`` not ``"hf"``), else
    transformers' ``AutoModelForCausalLM`` (the reason logged)."""
    if forward != "hf":
        light, reason = load_light_model(model_path, dtype)
        if light is not None:
            return light
        log.info("embedded engine: loading through transformers (%s)", reason)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
