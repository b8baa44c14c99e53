"""The engine's light model tree (:mod:`telescope.inference.embedded.light_model`).

Loaded from the safetensors files without transformers' modeling code, it must hold
exactly the checkpoint's parameters under transformers' names (so weight updates and
the state dict are unchanged), and the compact forward over it must give the same
logits as over the transformers model, bit for bit, for every family the compact
forward supports; anything it cannot load the same way falls back, with the reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from telescope.inference.embedded.compact import CompactDecoder
from telescope.inference.embedded.light_model import LightCausalLM, load_light_model

SIZES = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)

LINEAR_ROPE = {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}
FAMILIES: dict[str, Any] = {
    "qwen2-tied": Qwen2Config(**SIZES, tie_word_embeddings=True),
    "qwen2-untied": Qwen2Config(**SIZES, tie_word_embeddings=False),
    "qwen3-head-dim": Qwen3Config(**SIZES, head_dim=16, tie_word_embeddings=True),
    "llama-bias": LlamaConfig(**SIZES, attention_bias=True, tie_word_embeddings=False),
    "llama-linear-rope": LlamaConfig(**SIZES, rope_parameters=LINEAR_ROPE),
    "mistral": MistralConfig(**SIZES, sliding_window=None),
}


def save(config: Any, path: Path, seed: int = 0, dtype: torch.dtype = torch.float32) -> Path:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    with torch.no_grad():
        for name, param in model.named_parameters():  # norms and biases off their init values
            if "norm" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(path)
    return path


def compact_logits(model: Any, prompts: list[list[int]]) -> torch.Tensor:
    decoder = CompactDecoder(model, max_len=64)
    with torch.inference_mode():
        cache = decoder.new_cache(len(prompts), 8)
        width = max(len(p) for p in prompts)
        prefill = decoder.forward(
            cache, torch.tensor([p + [0] * (width - len(p)) for p in prompts]), [len(p) for p in prompts]
        )
        step = decoder.forward(cache, torch.tensor([[7]] * len(prompts)), [1] * len(prompts))
    return torch.cat([prefill, step])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_light_tree_is_the_transformers_model_for_the_compact_forward(family: str, tmp_path: Path) -> None:
    path = save(FAMILIES[family], tmp_path / family)
    light, reason = load_light_model(str(path), torch.float32)
    assert light is not None, reason
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    hf_state, light_state = hf.state_dict(), light.state_dict()
    assert list(light_state) == list(hf_state)  # same names, same order: weight updates address both alike
    assert all(torch.equal(light_state[k], hf_state[k]) for k in hf_state)
    tied = light.lm_head.weight is light.model.embed_tokens.weight
    assert tied == bool(FAMILIES[family].tie_word_embeddings)
    positions = torch.arange(65).unsqueeze(0)
    for got, want in zip(
        light.model.rotary_emb(torch.zeros(1), positions), hf.model.rotary_emb(torch.zeros(1), positions), strict=True
    ):
        assert torch.equal(got, want)
    prompts = [[5, 6, 7, 8, 9], [40, 41, 42], [11]]
    assert torch.equal(compact_logits(light, prompts), compact_logits(hf, prompts))
    assert light.generation_config.eos_token_id == hf.generation_config.eos_token_id


def test_weights_are_cast_to_the_engines_dtype(tmp_path: Path) -> None:
    path = save(FAMILIES["qwen2-tied"], tmp_path / "bf16", dtype=torch.bfloat16)
    light, _ = load_light_model(str(path), torch.float32)
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    assert light is not None and all(p.dtype == torch.float32 for p in light.parameters())
    assert all(torch.equal(a, b) for a, b in zip(light.state_dict().values(), hf.state_dict().values(), strict=True))


def test_a_sharded_checkpoint_loads_through_its_index(tmp_path: Path) -> None:
    path = save(FAMILIES["qwen2-untied"], tmp_path / "one")
    model = AutoModelForCausalLM.from_pretrained(str(path))
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    light, reason = load_light_model(str(tmp_path / "sharded"), torch.float32)
    assert light is not None, reason
    assert all(torch.equal(a, b) for a, b in zip(light.state_dict().values(), model.state_dict().values(), strict=True))


def edit_config(path: Path, **changes: Any) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def test_what_it_cannot_load_alike_falls_back_with_the_reason(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    assert load_light_model(str(tmp_path / "absent"), torch.float32) == (None, "not a local checkpoint folder")
    gpt2 = tmp_path / "gpt2"
    from transformers import GPT2Config

    AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(gpt2)
    assert "gpt2" in load_light_model(str(gpt2), torch.float32)[1]
    dynamic = save(FAMILIES["llama-bias"], tmp_path / "dynamic")
    edit_config(dynamic, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    assert "dynamic" in load_light_model(str(dynamic), torch.float32)[1]
    quantized = save(FAMILIES["mistral"], tmp_path / "quantized")
    edit_config(quantized, quantization_config={"quant_method": "bitsandbytes"})
    assert load_light_model(str(quantized), torch.float32) == (None, "the checkpoint is quantized")
    extra = save(FAMILIES["qwen2-tied"], tmp_path / "extra")  # a tensor the family's modules would not hold
    tensors = load_file(str(extra / "model.safetensors"))
    tensors["model.layers.0.mlp.down_proj.bias"] = torch.zeros(32)
    save_file(tensors, str(extra / "model.safetensors"), metadata={"format": "pt"})
    model, reason = load_light_model(str(extra), torch.float32)
    assert model is None and "unexpected ['model.layers.0.mlp.down_proj.bias']" in reason


def test_the_engine_loads_it_and_transformers_modeling_code_stays_unimported(tmp_path: Path) -> None:
    path = save(FAMILIES["qwen2-tied"], tmp_path / "model")
    probe = (
        "import sys\n"
        "from telescope.inference.embedded.engine import Engine, EngineSettings\n"
        f"engine = Engine(EngineSettings(model_path={str(path)!r}, max_model_len=64, max_num_seqs=2))\n"
        "print(type(engine.model).__name__, type(engine.runner).__name__,"
        " 'transformers.modeling_utils' in sys.modules)\n"
        f"engine = Engine(EngineSettings(model_path={str(path)!r}, max_model_len=64, max_num_seqs=2, forward='hf'))\n"
        "print(type(engine.model).__name__, type(engine.runner).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split("\n")[:2] == ["LightCausalLM CompactRunner False", "Qwen2ForCausalLM HFRunner"]
    assert isinstance(load_light_model(str(path), torch.float32)[0], LightCausalLM)
