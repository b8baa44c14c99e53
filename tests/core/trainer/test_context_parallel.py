"""Context parallelism of the fsdp backend (telescope.trainer.context_parallel), also the megatron backend's layout.

The layout: a row cut into ``2 CP`` chunks, rank ``r`` keeping chunks ``r`` and
``2 CP - 1 - r`` (torch's head-tail layout). Training: on two gloo CPU ranks, one
``train_step`` at ``fsdp_context_parallel_size`` 2 equals the step at 1 (loss,
gradient norm, entropy, every gradient and every updated weight), with and
without gradient checkpointing, on packed rows of several samples whose lengths
are not all multiples of ``2 CP`` (the padding path); the trainer's log-probability
forward (the ratio reference) equals too. At 4 ranks (2 data-parallel groups of 2)
the step equals the 1-rank step as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from telescope.testing.trainer import spawn_ranks, synthetic_batch, tiny_trainer_config, weights_snapshot
from telescope.trainer.context_parallel import document_ids, gathered_order, local_indices, local_mask

CPU = torch.device("cpu")

#: Packed rows of 64 tokens, no alignment padding: 8 samples of 10..25 tokens in rows of 63, 61 and 21
#: tokens holding 3, 3 and 2 samples (none a multiple of 2 x CP).
SETTINGS: dict[str, Any] = {"seq_len": 64, "pad_to_multiple_of": 1, "max_model_len": 40, "max_tokens": 25}


def test_each_rank_keeps_one_early_and_one_late_chunk() -> None:
    assert local_indices(8, 2, 0, CPU).tolist() == [0, 1, 6, 7]
    assert local_indices(8, 2, 1, CPU).tolist() == [2, 3, 4, 5]
    assert local_indices(12, 3, 1, CPU).tolist() == [2, 3, 8, 9]


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_ranks_cover_the_row_once_with_equal_causal_work(cp: int) -> None:
    length = 8 * cp
    order = gathered_order(length, cp, CPU)
    assert sorted(order.tolist()) == list(range(length))  # a permutation: every token on exactly one rank
    # Under a causal mask query i attends to i + 1 keys: every rank gets the same number of query-key pairs.
    work = {sum(i + 1 for i in local_indices(length, cp, rank, CPU).tolist()) for rank in range(cp)}
    assert len(work) == 1


def torchs_head_tail_order(length: int, cp: int) -> torch.Tensor:
    """The gathered order of torch's private ``_HeadTailLoadBalancer``; skips when this torch moved or changed it.

    The class is private (``torch.distributed.tensor.experimental._context_parallel``): a torch
    release may rename, move or re-sign it. That is not a fault of ours, so the comparison skips,
    naming the torch version; a layout that differs still fails.
    """
    balancer_module = pytest.importorskip("torch.distributed.tensor.experimental._context_parallel._load_balancer")
    try:
        balancer = balancer_module._HeadTailLoadBalancer(length, cp, CPU)
        indices = balancer._generate_indices()
    except (AttributeError, TypeError) as error:
        pytest.skip(f"torch {torch.__version__} changed its private head-tail load balancer: {error}")
    if not isinstance(indices, torch.Tensor) or indices.dim() != 2:
        pytest.skip(
            f"torch {torch.__version__}'s head-tail load balancer returns {type(indices).__name__}, not a 2-D tensor"
        )
    return indices[0].long()


@pytest.mark.parametrize("cp", [2, 3])
def test_the_layout_is_torchs_head_tail_layout(cp: int) -> None:
    assert torch.equal(torchs_head_tail_order(8 * cp, cp), gathered_order(8 * cp, cp, CPU))


def test_a_moved_private_balancer_skips_the_comparison(monkeypatch: pytest.MonkeyPatch) -> None:
    balancer_module = pytest.importorskip("torch.distributed.tensor.experimental._context_parallel._load_balancer")
    monkeypatch.delattr(balancer_module, "_HeadTailLoadBalancer")
    with pytest.raises(pytest.skip.Exception, match="changed its private head-tail load balancer"):
        torchs_head_tail_order(16, 2)


def test_local_mask_is_the_rows_and_gathered_columns_of_the_document_mask() -> None:
    position_ids = torch.tensor([0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 0, 0])  # samples of 3, 5, 2 tokens, 2 padding
    assert document_ids(position_ids).tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 3, 4]
    n = position_ids.numel()
    full = torch.zeros(n, n, dtype=torch.bool)
    for start, stop in ((0, 3), (3, 8), (8, 10), (10, 11), (11, 12)):
        full[start:stop, start:stop] = torch.ones(stop - start, stop - start, dtype=torch.bool).tril()
    order = gathered_order(n, 2, CPU)
    for rank in (0, 1):
        rows = local_indices(n, 2, rank, CPU)
        assert torch.equal(local_mask(position_ids, rows, order)[0, 0], full[rows][:, order])


# ----------------------------------------------------------------- training


def _backend(model: Path, cp: int, workers: int, checkpointing: bool, algorithm: str) -> Any:
    from telescope.plugins.facade import get_plugins

    config = tiny_trainer_config(
        model,
        fsdp_context_parallel_size=cp,
        trainer_num_workers=workers,
        gradient_checkpointing=checkpointing,
        algorithm=algorithm,
        **SETTINGS,
    )
    plugins = get_plugins()
    return plugins.create_trainer_backend(config, plugins.create_algorithm(config))


def one_step(
    model: Path, cp: int = 1, rank: int = 0, world_size: int = 1, *, checkpointing: bool, algorithm: str = "grpo"
) -> dict[str, Any]:
    """Gradients, reference log-probabilities, metrics and weights of one ``train_step`` on the same batch."""
    from telescope.trainer.metrics import SectionTimers

    backend = _backend(model, cp, world_size, checkpointing, algorithm)
    backend.setup(rank, world_size, "cpu")
    try:
        batch = synthetic_batch(num_groups=4, completion_lengths=(5, 20))
        rows = backend._local_sequences(backend._pack(batch.samples))
        logprobs = backend.reference_logprobs([rows], SectionTimers(backend.device))[0]
        backend.accumulate_gradients(batch.samples)
        grads = backend.full_gradients()
        backend.zero_grad()
        before = weights_snapshot(backend)
        metrics = backend.train_step(batch)
        after = weights_snapshot(backend)
    finally:
        backend.close()
    return {
        "rows": [(len(r.input_ids), len(set(r.sequence_ids) - {-1})) for r in rows],
        "logprobs": logprobs,
        "grads": grads,
        "metrics": metrics,
        "before": before,
        "after": after,
    }


def cp_worker(rank: int, world_size: int, model: Path, cp: int, out: Path) -> None:
    from telescope.trainer.distributed import destroy_process_group, init_process_group

    init_process_group(rank, world_size, CPU)  # one group for both backends (each builds its mesh in it)
    steps = [one_step(model, cp, rank, world_size, checkpointing=c) for c in (False, True)]
    torch.save(steps, out / f"rank{rank}.pt")
    destroy_process_group()


def assert_same_step(got: dict[str, Any], want: dict[str, Any]) -> None:
    for key in ("loss", "grad_norm", "entropy", "kl_divergence_inference", "train/loss_tokens"):
        assert got["metrics"][key] == pytest.approx(want["metrics"][key], rel=1e-5, abs=1e-6), key
    for name, grad in want["grads"].items():
        torch.testing.assert_close(got["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    # Adam's first step moves a weight by about lr * g / (|g| + eps): float32 rounding of a gradient
    # element near eps changes its update by up to a few 1e-6 (lr is 1e-3), so 1% of the learning rate.
    for name, tensor in want["after"].items():
        torch.testing.assert_close(got["after"][name], tensor, atol=1e-5, rtol=0, msg=name)
    moved = max(float((want["after"][k] - want["before"][k]).abs().max()) for k in want["after"])
    assert moved > 1e-4, "the step did not move the weights: the comparison would prove nothing"


def test_context_parallel_2_equals_one_rank(tiny_model: Path, tmp_path: Path) -> None:
    spawn_ranks(cp_worker, 2, tiny_model, 2, tmp_path)
    for checkpointing, index in ((False, 0), (True, 1)):
        want = one_step(tiny_model, checkpointing=checkpointing)
        assert all(samples >= 2 for _, samples in want["rows"]), "every row should pack several samples"
        assert any(length % 4 for length, _ in want["rows"]), "some row should need padding to 2 x CP"
        for rank in (0, 1):
            got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)[index]
            assert got["rows"] == want["rows"]  # both CP ranks take every row (one data-parallel group)
            for mine, reference in zip(got["logprobs"], want["logprobs"], strict=True):
                torch.testing.assert_close(mine, reference, rtol=1e-5, atol=1e-5)
            assert_same_step(got, want)


@pytest.mark.slow
def test_two_data_parallel_groups_of_context_parallel_2_equal_one_rank(tiny_model: Path, tmp_path: Path) -> None:
    spawn_ranks(cp_worker, 4, tiny_model, 2, tmp_path)
    want = [one_step(tiny_model, checkpointing=c) for c in (False, True)]
    results = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(4)]
    for index in (0, 1):
        # ranks 0, 1 are data-parallel group 0 and ranks 2, 3 group 1: the rows are dealt between the groups
        assert results[0][index]["rows"] == results[1][index]["rows"] != results[2][index]["rows"]
        dealt = [row for rank in (0, 2) for row in results[rank][index]["rows"] if row[1]]  # not the filler rows
        assert sorted(dealt) == sorted(want[index]["rows"])
        for result in results:
            assert_same_step(result[index], want[index])
