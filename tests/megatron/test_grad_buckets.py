"""The bucketed data-parallel gradient reduction, and its overlap with the backward.

Two gloo ranks, on the tiny Qwen2: data parallel 2 and context parallel 2, each with
buckets small enough to make several, with and without ``megatron_overlap_grad_reduce``.
Every step equals the FSDP backend's (the comparison of ``test_training``); the overlapped
step equals the one reduced after the backward bit for bit (each bucket sums the same two
tensors); and the overlapped runs issue their bucket all-reduces *while* the backward runs,
as observed from outside the backend: ``Tensor.backward`` and ``dist.all_reduce`` are
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
    steps = [bucketed_step(model, rank, world_size, megatron_gradient_checkpointing=False, **run) for run in RUNS]
    torch.save(steps, Path(out) / f"rank{rank}.pt")
    destroy_process_group()


@pytest.mark.slow
def test_bucketed_and_overlapped_reduction_equal_fsdp(tiny_model: Path, tmp_path: Path) -> None:
    spawn_ranks(buckets_worker, 2, str(tiny_model), str(tmp_path))
    fsdp = one_step(str(tiny_model), "fsdp")
    for rank in range(2):
        after, overlapped, context_parallel = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        for step in (after, overlapped, context_parallel):
            assert step["buckets"] >= 4, "the bucket size should force several buckets"
            assert_same_step(step, fsdp)
        # without overlap nothing is launched inside a backward; with it every bucket is
        assert after["launched_in_backward"] == after["counted_by_reducer"] == 0
        for step in (overlapped, context_parallel):
            assert step["launched_in_backward"] == step["counted_by_reducer"] == step["buckets"]
        # the same sums in the same order: the same step, bit for bit
        assert overlapped["metrics"]["grad_norm"] == after["metrics"]["grad_norm"]
        for name, tensor in after["after"].items():
            assert torch.equal(overlapped["gradients"][name], after["gradients"][name]), name
            assert torch.equal(overlapped["after"][name], tensor), name
