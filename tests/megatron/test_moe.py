"""MoE training (Qwen3-MoE): one step of the megatron backend equals one of the FSDP backend, EP 1, 2, x TP, x PP.

Same config, same HF weights, same batch. Compared: the loss and the other metrics,
the gradient the optimizer applies (reduced over ranks and clipped; every weight,
the router's and the experts' 3-D tensors included) and every weight after the
step. With expert parallelism the ranks are also data parallel (each its own
sequences), so an expert's gradient must gather the tokens every rank routed to it.

Tolerances: the dense tests' (tests/megatron/test_training.py), measured for these MoE
runs too: the gradients to float32 rounding on one minibatch (2.6e-8), after a first
minibatch's step to 5e-4 of the tensor's largest (9.0e-7 measured, 9.3e-5 of the largest, on an
AVX-512 CPU), the weights to 1e-5 except the few elements whose gradient is near AdamW's eps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.megatron.conftest import build_family_model
from tests.megatron.test_training import BATCH_REFERENCE, assert_same_step, one_step

from telescope.testing.trainer import spawn_ranks


def assert_same_moe_step(got: dict[str, Any], want: dict[str, Any], minibatches: int = 1) -> None:
    """The dense comparison (metrics, applied gradients, weights), and the router moved."""
    assert_same_step(got, want, minibatches)
    router = (got["after"]["model.layers.0.mlp.gate.weight"] - got["before"]["model.layers.0.mlp.gate.weight"]).abs()
    assert float(router.max()) > 1e-4, "the router did not train"


def moe_models(base: Path) -> dict[str, str]:
    return {
        family: str(build_family_model(base / f"megatron-{family}", family))
        for family in ("qwen3_moe", "qwen3_moe_mixed")
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return moe_models(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def fsdp(models: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The FSDP backend's step on each MoE model (the Hugging Face model, one rank)."""
    return {family: one_step(model, "fsdp") for family, model in models.items()}


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_moe_mixed"])
def test_one_step_equals_fsdp_at_ep1(models: dict[str, str], fsdp: dict[str, dict[str, Any]], family: str) -> None:
    megatron = one_step(models[family], "megatron", megatron_gradient_checkpointing=False)
    assert_same_moe_step(megatron, fsdp[family])


def runs_worker(rank: int, world_size: int, models: dict[str, str], runs: list, out: str) -> None:
    from telescope.trainer.distributed import destroy_process_group, init_process_group

    init_process_group(rank, world_size, torch.device("cpu"))  # one group for every run below
    steps = [
        one_step(models[family], "megatron", rank, world_size, trainer_num_workers=world_size, **o)
        for family, o in runs
    ]
    if rank == 0:
        torch.save(steps, out)
    destroy_process_group()


def check_runs(runs: list, steps: list, models: dict[str, str], fsdp: dict[str, dict[str, Any]]) -> None:
    for (family, overrides), step in zip(runs, steps, strict=True):
        fsdp_overrides = {k: v for k, v in overrides.items() if not k.startswith("megatron_")}
        want = one_step(models[family], "fsdp", **fsdp_overrides) if fsdp_overrides else fsdp[family]
        assert_same_moe_step(step, want, overrides.get("number_of_minibatches", 1))


EP = {"megatron_expert_parallel_size": 2}
#: EP 2 on two ranks (two experts each, and two data-parallel ranks): every layer sparse, a dense middle layer with
#: recomputation, two minibatches with the batch ratio reference (a forward-only pass through the experts first);
#: then EP 2 over two context-parallel ranks (each rank's half of every row goes to both ranks' experts); then
#: both with the gradient buckets overlapped with the backward (dense and expert buckets on their two groups).
OVERLAP = {"megatron_overlap_grad_reduce": True}
EP2_RUNS: list[tuple[str, dict[str, Any]]] = [
    ("qwen3_moe", {**EP, "megatron_gradient_checkpointing": False}),
    ("qwen3_moe_mixed", {**EP, "megatron_gradient_checkpointing": True}),
    ("qwen3_moe", {**EP, "megatron_gradient_checkpointing": False, "number_of_minibatches": 2, **BATCH_REFERENCE}),
    ("qwen3_moe_mixed", {**EP, "megatron_context_parallel_size": 2, "megatron_gradient_checkpointing": False}),
    ("qwen3_moe", {**EP, **OVERLAP, "megatron_gradient_checkpointing": False}),
    (
        "qwen3_moe_mixed",
        {**EP, **OVERLAP, "megatron_context_parallel_size": 2, "megatron_gradient_checkpointing": True},
    ),
]


@pytest.mark.slow
def test_expert_parallel_ep2_equals_fsdp(
    models: dict[str, str], fsdp: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    spawn_ranks(runs_worker, 2, models, EP2_RUNS, str(tmp_path / "ep2.pt"))
    check_runs(EP2_RUNS, torch.load(tmp_path / "ep2.pt", weights_only=False), models, fsdp)


#: Four ranks: TP 2 x EP 2 (sequence parallel, as megatron-core requires for MoE under TP; the experts split over
#: TP too, so each TP rank gathers a different number of tokens), then PP 2 x EP 2 (one layer per stage).
FOUR_RANK_RUNS: list[tuple[str, dict[str, Any]]] = [
    ("qwen3_moe", {**EP, "megatron_tensor_parallel_size": 2, "megatron_gradient_checkpointing": True}),
    ("qwen3_moe", {**EP, "megatron_pipeline_parallel_size": 2, "megatron_gradient_checkpointing": False}),
]


@pytest.mark.slow
def test_ep2_with_tp2_and_with_pp2_equal_fsdp(
    models: dict[str, str], fsdp: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    spawn_ranks(runs_worker, 4, models, FOUR_RANK_RUNS, str(tmp_path / "four.pt"))
    check_runs(FOUR_RANK_RUNS, torch.load(tmp_path / "four.pt", weights_only=False), models, fsdp)
