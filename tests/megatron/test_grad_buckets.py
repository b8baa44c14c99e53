"""The bucketed data-parallel gradient reduction, and its overlap with the backward.

Two gloo ranks, on the tiny Qwen2: data parallel 2 and context parallel 2, each with
buckets small enough to make several, with and without ``megatron_overlap_grad_reduce``
(and with recomputation). Every float32 step equals the FSDP backend's (the comparison of
``test_training``); the overlapped step equals the one reduced after the backward bit for
bit (each bucket sums the same two tensors), in float32 and under bfloat16 compute with
float32 buffers and with bfloat16 ones (``megatron_grad_reduce_in_fp32: false``); and
the overlapped runs issue their bucket all-reduces *while* the backward runs, as
observed from outside the backend: ``Tensor.backward`` and ``dist.all_reduce`` are
wrapped, and the asynchronous all-reduces started inside a backward are counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from telescope_megatron.grad_buckets import plan_buckets
from tests.megatron.test_training import (
    GROUPS,
    LENGTHS,
    assert_same_step,
    make_backend,
    one_step,
    record_applied_gradients,
)

from telescope.testing.trainer import spawn_ranks, synthetic_batch, weights_snapshot

#: Elements per bucket in the runs below: the tiny model's parameters make many buckets.
SMALL_BUCKET = 6000

RUNS: list[dict[str, Any]] = [
    {"megatron_overlap_grad_reduce": False},  # data parallel 2, reduced after the backward
    {"megatron_overlap_grad_reduce": True},  # data parallel 2, overlapped
    {"megatron_overlap_grad_reduce": True, "megatron_context_parallel_size": 2},  # the DP x CP group, overlapped
    {"megatron_overlap_grad_reduce": True, "megatron_gradient_checkpointing": True},  # hooks inside the recompute
]
#: bfloat16 compute, off then on: float32 buffers of their own, then buffers in bfloat16 (the parameters' grads).
BF16_RUNS: list[dict[str, Any]] = [
    {"mixed_precision_dtype": "bfloat16", "megatron_overlap_grad_reduce": overlap, "megatron_grad_reduce_in_fp32": fp32}
    for fp32 in (True, False)
    for overlap in (False, True)
]


def test_plan_buckets_respects_size_dtype_and_group() -> None:
    f32, bf16 = torch.float32, torch.bfloat16
    params = [("a", 4, f32, 0), ("b", 4, f32, 0), ("c", 3, f32, 0), ("d", 10, f32, 0), ("e", 2, bf16, 0)]
    params += [("x", 2, f32, 1), ("f", 1, f32, 0)]
    assert plan_buckets(params, 8) == [
        (("a", "b"), f32, 0),  # full at 8
        (("c",), f32, 0),  # "d" does not fit with it
        (("d",), f32, 0),  # larger than a bucket: alone
        (("e",), bf16, 0),  # another dtype: its own bucket
        (("x",), f32, 1),  # another group: its own bucket
        (("f",), f32, 0),  # after "d" the open bucket was full
    ]
    assert plan_buckets(params[:3], 100) == [(("a", "b", "c"), f32, 0)]
    with pytest.raises(ValueError, match="at least 1"):
        plan_buckets(params, 0)


def test_a_gradient_accumulated_after_its_bucket_started_is_an_error() -> None:
    """Two backwards under one arm: the second accumulates into a bucket already reduced, and is refused."""
    import torch.distributed as dist
    from telescope_megatron.grad_buckets import GradReducer
    from telescope_megatron.precision import MainParameters, Precision

    from telescope.trainer.distributed import destroy_process_group, init_process_group

    owned = init_process_group(0, 1, torch.device("cpu"))
    try:
        params = {"a": torch.nn.Parameter(torch.ones(3)), "b": torch.nn.Parameter(torch.ones(2))}
        main = MainParameters(params, Precision())
        reducer = GradReducer(main, dict.fromkeys(reversed(params), dist.group.WORLD), 1, overlap=True)
        reducer.arm()
        (params["a"].sum() + params["b"].sum()).backward()  # both ready: the one bucket starts
        with pytest.raises(RuntimeError, match=r"gradient of [ab] was accumulated again"):
            (params["a"].sum() * 2).backward()
        reducer.arm()  # a new last backward: accepted again
        (params["a"].sum() + params["b"].sum()).backward()
        reducer.finish()
        assert torch.equal(main.accumulated("b"), torch.full((2,), 2.0))  # one rank, divisor 1: the local sum
        reducer.close()
        main.close()
    finally:
        if owned:
            destroy_process_group()


def bucketed_step(model: str, rank: int, world_size: int, **overrides: Any) -> dict[str, Any]:
    """``test_training.one_step`` with small buckets; adds the bucket count and the all-reduces inside backwards."""
    import torch.distributed as dist

    backend = make_backend(model, "megatron", trainer_num_workers=world_size, **overrides)
    backend.grad_bucket_elements = SMALL_BUCKET  # type: ignore[attr-defined]
    backend.setup(rank, world_size, "cpu")
    before = weights_snapshot(backend)
    applied = record_applied_gradients(backend)
    in_backward = [False]
    launched = [0]
    backward, all_reduce = torch.Tensor.backward, dist.all_reduce

    def observed_backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        in_backward[0] = True
        try:
            return backward(self, *args, **kwargs)
        finally:
            in_backward[0] = False

    def observed_all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if in_backward[0] and kwargs.get("async_op"):
            launched[0] += 1
        return all_reduce(tensor, *args, **kwargs)

    torch.Tensor.backward = observed_backward  # type: ignore[method-assign]
    dist.all_reduce = observed_all_reduce
    try:
        metrics = backend.train_step(synthetic_batch(completion_lengths=LENGTHS, num_groups=GROUPS))
    finally:
        torch.Tensor.backward = backward  # type: ignore[method-assign]
        dist.all_reduce = all_reduce
    reducer = backend.grad_reducer  # type: ignore[attr-defined]
    result = {
        "metrics": metrics,
        "before": before,
        "after": weights_snapshot(backend),
        "gradients": applied,
        "buckets": len(reducer.buckets),
        "launched_in_backward": launched[0],
        "counted_by_reducer": reducer.launched_during_backward,
    }
    backend.close()
    return result


def buckets_worker(rank: int, world_size: int, model: str, out: str) -> None:
    from telescope.trainer.distributed import destroy_process_group, init_process_group

    init_process_group(rank, world_size, torch.device("cpu"))
    steps = [
        bucketed_step(model, rank, world_size, **{"megatron_gradient_checkpointing": False, **run})
        for run in RUNS + BF16_RUNS
    ]
    torch.save(steps, Path(out) / f"rank{rank}.pt")
    destroy_process_group()


@pytest.mark.slow
def test_bucketed_and_overlapped_reduction_equal_fsdp(tiny_model: Path, tmp_path: Path) -> None:
    spawn_ranks(buckets_worker, 2, str(tiny_model), str(tmp_path))
    fsdp = one_step(str(tiny_model), "fsdp")
    for rank in range(2):
        steps = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        after, *overlapped_runs = steps[: len(RUNS)]
        for step in steps:
            assert step["buckets"] >= 4, "the bucket size should force several buckets"
        for step in steps[: len(RUNS)]:
            assert_same_step(step, fsdp)
        # without overlap nothing is launched inside a backward; with it every bucket is
        for run, step in zip(RUNS + BF16_RUNS, steps, strict=True):
            want = step["buckets"] if run["megatron_overlap_grad_reduce"] else 0
            assert step["launched_in_backward"] == step["counted_by_reducer"] == want, run
        # the same sums in the same order: the same step, bit for bit
        pairs = [(after, overlapped_runs[0]), (after, overlapped_runs[2])]  # recomputation: the same gradients
        bf16 = steps[len(RUNS) :]
        pairs += [(bf16[0], bf16[1]), (bf16[2], bf16[3])]
        for plain, overlapped in pairs:
            assert overlapped["metrics"]["grad_norm"] == plain["metrics"]["grad_norm"]
            for name, tensor in plain["after"].items():
                assert torch.equal(overlapped["gradients"][name], plain["gradients"][name]), name
                assert torch.equal(overlapped["after"][name], tensor), name
        moved = max(float((bf16[1]["after"][k] - bf16[1]["before"][k]).abs().max()) for k in bf16[1]["after"])
        assert moved > 1e-4, "the bfloat16 step did not move the weights"


def pipeline_worker(rank: int, world_size: int, model: str, out: str) -> None:
    from telescope.trainer.distributed import destroy_process_group, init_process_group

    init_process_group(rank, world_size, torch.device("cpu"))
    step = bucketed_step(
        model,
        rank,
        world_size,
        megatron_pipeline_parallel_size=2,
        megatron_overlap_grad_reduce=True,
        megatron_gradient_checkpointing=False,
    )
    torch.save(step, Path(out) / f"rank{rank}.pt")
    destroy_process_group()


@pytest.mark.slow
def test_overlap_under_pipeline_parallelism_equals_fsdp(tiny_model: Path, tmp_path: Path) -> None:
    """PP 2 x DP 2: the reducer armed for the whole 1F1B schedule launches every bucket inside it.

    megatron-core's schedule runs its backwards through the autograd engine directly (not
    ``Tensor.backward``), so the launches are counted by the reducer's hooks here.
    """
    spawn_ranks(pipeline_worker, 4, str(tiny_model), str(tmp_path))
    fsdp = one_step(str(tiny_model), "fsdp")
    for rank in range(4):
        step = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        assert step["buckets"] >= 4, "the bucket size should force several buckets"
        assert step["counted_by_reducer"] == step["buckets"]
        assert_same_step(step, fsdp)
