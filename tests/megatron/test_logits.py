"""The megatron model's logits equal the Hugging Face model's (float32, CPU) at TP 1 and TP 2, packed or not.

MoE models (Qwen3-MoE) also at EP 2: each rank holds half the experts, tokens go to them by all-to-all.

Each rank builds the backend (HF weights converted and sharded), runs a packed row
of three samples and each sample alone; rank 0 writes the logits, which the test
compares with ``AutoModelForCausalLM`` run on each sample separately.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from telescope.api.context import TrainerContext
from telescope.testing.trainer import spawn_ranks

SAMPLES = [[1, 5, 9, 30, 2], [7, 8, 100, 3], [4, 5, 6, 11, 12, 13, 14, 200]]


def megatron_logits(rank: int, world_size: int, models: list[str], **sizes: int) -> dict[str, dict]:
    """Packed and per-sample logits of each model, from the backend at ``sizes`` (default: TP ``world_size``)."""
    from telescope_megatron.backend import MegatronBackend
    from telescope_megatron.model import packed_logits
    from telescope_megatron.plugin import MegatronSettings

    results = {}
    sizes = sizes or {"megatron_tensor_parallel_size": world_size}
    for model in models:
        settings = MegatronSettings(**sizes, megatron_gradient_checkpointing=False)
        backend = MegatronBackend(TrainerContext(model=model), None, settings)  # type: ignore[arg-type]
        backend.setup(rank, world_size, "cpu")
        with torch.no_grad():
            ids = torch.tensor([[t for s in SAMPLES for t in s]])
            pos = torch.tensor([[i for s in SAMPLES for i in range(len(s))]])
            packed = packed_logits(backend.model, ids, pos)
            alone = [packed_logits(backend.model, torch.tensor([s]), torch.arange(len(s))[None]) for s in SAMPLES]
        results[model] = {"packed": packed, "alone": alone}
        backend.close()
    return results


def logits_worker(rank: int, world_size: int, models: list[str], out: str, sizes: dict[str, int] | None = None) -> None:
    from telescope.trainer.distributed import destroy_process_group, init_process_group

    init_process_group(rank, world_size, torch.device("cpu"))  # one group for all models (backends reuse it)
    results = megatron_logits(rank, world_size, models, **(sizes or {}))
    if rank == 0:
        torch.save(results, out)
    destroy_process_group()


def assert_equal_to_hugging_face(results: dict[str, dict], models: list[str]) -> None:
    from transformers import AutoModelForCausalLM

    for model in models:
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        with torch.no_grad():
            reference = [hf(input_ids=torch.tensor([s])).logits[0] for s in SAMPLES]
        for got, want in zip(results[model]["alone"], reference, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        torch.testing.assert_close(results[model]["packed"], torch.cat(reference), atol=1e-5, rtol=0)


def test_logits_equal_hugging_face_at_tp1(family_model: Path) -> None:
    assert_equal_to_hugging_face(megatron_logits(0, 1, [str(family_model)]), [str(family_model)])


@pytest.mark.slow
def test_logits_equal_hugging_face_at_tp2(tiny_model: Path, tmp_path: Path, tmp_path_factory) -> None:
    from tests.megatron.conftest import build_family_model

    base = tmp_path_factory.getbasetemp()
    models = [str(tiny_model)] + [str(build_family_model(base / f"megatron-{f}", f)) for f in ("qwen3", "llama")]
    spawn_ranks(logits_worker, 2, models, str(tmp_path / "logits.pt"))
    assert_equal_to_hugging_face(torch.load(tmp_path / "logits.pt"), models)


@pytest.mark.slow
def test_moe_logits_equal_hugging_face_at_ep2(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """EP 2 (two experts per rank), every layer sparse (top-2 renormalised) and a dense middle layer (top-2 as is)."""
    from tests.megatron.conftest import build_family_model

    base = tmp_path_factory.getbasetemp()
    models = [str(build_family_model(base / f"megatron-{f}", f)) for f in ("qwen3_moe", "qwen3_moe_mixed")]
    spawn_ranks(logits_worker, 2, models, str(tmp_path / "logits.pt"), {"megatron_expert_parallel_size": 2})
    assert_equal_to_hugging_face(torch.load(tmp_path / "logits.pt"), models)
