"""Fixtures of the telescope-megatron tests: tiny models of each supported family, built locally.

The whole folder is skipped when telescope-megatron (or megatron-core) is not
installed: tests that build the backend by name need its ``telescope`` entry point.
"""

from __future__ import annotations

import importlib.metadata
import warnings
from pathlib import Path

import pytest

try:
    importlib.metadata.distribution("telescope-megatron")
    with warnings.catch_warnings():  # megatron-core warns at import that Transformer Engine/Apex are absent
        warnings.simplefilter("ignore")
        import megatron.core  # noqa: F401
except (importlib.metadata.PackageNotFoundError, ImportError):
    collect_ignore_glob = ["test_*.py"]

#: Small configs of the families besides the tiny models' Qwen2 (head_dim != hidden/heads for Qwen3).
#: Qwen3-MoE: four experts, top 2 of them renormalised (``norm_topk_prob``), every layer sparse; the "mixed"
#: variant has a dense middle layer (``mlp_only_layers``) and keeps the top-2 probabilities as they are.
FAMILIES = {
    "qwen3": dict(
        model_type="qwen3",
        vocab_size=384,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    ),
    "llama": dict(
        model_type="llama",
        vocab_size=384,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        max_position_embeddings=256,
        rope_theta=500000.0,
    ),
    "qwen3_moe": dict(
        model_type="qwen3_moe",
        vocab_size=384,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=48,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    ),
    "qwen3_moe_mixed": dict(
        model_type="qwen3_moe",
        vocab_size=384,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=48,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        mlp_only_layers=[1],
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=False,
        max_position_embeddings=256,
    ),
}


def build_family_model(folder: Path, family: str) -> Path:
    """A randomly initialised HF model of ``family`` (or the tiny Qwen2 preset for ``qwen2``) saved in ``folder``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from telescope.models.tiny import PRESETS, build_tiny_model

    if (folder / "config.json").exists():
        return folder
    if family == "qwen2":
        build_tiny_model(folder, PRESETS["test"])
        return folder
    values = dict(FAMILIES[family])
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # the default init leaves norms at 1: perturb them so a mapping mistake shows
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
            if name.endswith("mlp.gate.weight"):  # MoE router: decisive routing (no near-ties to flip on rounding)
                param.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_family_model(tmp_path_factory.getbasetemp() / "megatron-qwen2", "qwen2")


@pytest.fixture(scope="session", params=["qwen2", "qwen3", "llama", "qwen3_moe", "qwen3_moe_mixed"])
def family_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_family_model(tmp_path_factory.getbasetemp() / f"megatron-{request.param}", request.param)


@pytest.fixture(scope="session")
def moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_family_model(tmp_path_factory.getbasetemp() / "megatron-qwen3_moe", "qwen3_moe")
