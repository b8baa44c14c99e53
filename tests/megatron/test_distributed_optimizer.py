"""The distributed optimizer (``megatron_use_distributed_optimizer``): AdamW states sharded over data-parallel ranks.

On spawned gloo ranks: at DP 2 (two ranks) and at DP 2 x TP 2 (four ranks), two
trainer steps under a warmup schedule (a new learning rate each step) equal the
FSDP backend's two steps at one rank, and the unsharded megatron optimizer's;
each rank's optimizer holds the states of its own parameters only (disjoint, all
covered, about half of the elements each); the warm start's optimizer is sharded
too and trains as the FSDP backend's. A checkpoint saved after one step and
resumed in fresh processes gives, after the second step, exactly the weights of
two uninterrupted steps, and refuses to resume its states unsharded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.megatron.test_training import (
    LENGTHS,
    assert_same_step,
    make_backend,
    record_applied_gradients,
    supervised,
)

from telescope.testing.trainer import spawn_ranks, synthetic_batch, weights_snapshot

#: A new learning rate at each step: the schedule must reach the sharded optimizer (and survive a resume).
SCHEDULE: dict[str, Any] = {"lr_scheduler": "constant", "warmup_steps": 3, "megatron_gradient_checkpointing": False}
FSDP_SCHEDULE = {k: v for k, v in SCHEDULE.items() if not k.startswith("megatron_")}


def batch(step: int) -> Any:
    return synthetic_batch(completion_lengths=LENGTHS, num_groups=2, seed=step, step=step)


def shard_of(backend: Any) -> dict[str, Any]:
    """Which parameters (by index) this rank's optimizer keeps states for, and how many elements those are."""
    from telescope_megatron.optimizer import local_optimizer

    params = list(backend.model.parameters())
    state = local_optimizer(backend.optimizer).state
    owned = [i for i, p in enumerate(params) if p in state]
    return {
        "owned": owned,
        "state_numel": sum(int(state[params[i]]["exp_avg"].numel()) for i in owned),
        "param_numels": [p.numel() for p in params],
    }


def train(
    model: str,
    backend_name: str,
    rank: int = 0,
    world_size: int = 1,
    *,
    steps: int = 2,
    save: Path | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """``steps`` trainer steps from the HF weights: per step the metrics, the weights before and after, and the
    gradients applied."""
    backend = make_backend(model, backend_name, **overrides)
    backend.setup(rank, world_size, "cpu")
    runs, weights = [], weights_snapshot(backend)
    applied = record_applied_gradients(backend)
    for step in range(steps):
        metrics = backend.train_step(batch(step))
        after = weights_snapshot(backend)
        runs.append({"metrics": metrics, "before": weights, "after": after, "gradients": dict(applied)})
        weights = after
    shard = shard_of(backend) if backend_name == "megatron" else None
    if save is not None:
        backend.save_checkpoint(save, training_state=True)
    backend.close()
    return {"steps": runs, "shard": shard}


def dp2_worker(rank: int, world_size: int, model: str, out: str) -> None:
    from telescope.trainer.distributed import destroy_process_group, init_process_group

    init_process_group(rank, world_size, torch.device("cpu"))
    dp = {"trainer_num_workers": world_size, **SCHEDULE}
    result = {
        "sharded": train(model, "megatron", rank, world_size, **dp),
        "unsharded": train(model, "megatron", rank, world_size, **dp, megatron_use_distributed_optimizer=False),
        "supervised": supervised(
            model, "megatron", rank, world_size, trainer_num_workers=world_size, megatron_gradient_checkpointing=False
        ),
    }
    train(model, "megatron", rank, world_size, steps=1, save=Path(out) / "ckpt", **dp)
    torch.save(result, Path(out) / f"rank{rank}.pt")
    destroy_process_group()


def resume_worker(rank: int, world_size: int, model: str, out: str) -> None:
    """Fresh processes: resume the one-step checkpoint and take the second step; unsharded, the resume is refused."""
    from telescope_megatron.optimizer import is_sharded

    from telescope.trainer.distributed import destroy_process_group, init_process_group

    init_process_group(rank, world_size, torch.device("cpu"))
    dp = {"trainer_num_workers": world_size, **SCHEDULE}
    backend = make_backend(model, "megatron", **dp)
    backend.setup(rank, world_size, "cpu")
    meta = backend.load_checkpoint(Path(out) / "ckpt")
    metrics = backend.train_step(batch(1))
    sharded = is_sharded(backend.optimizer)  # type: ignore[attr-defined]
    result = {"step": meta["step"], "sharded": sharded, "metrics": metrics, "after": weights_snapshot(backend)}
    backend.close()
    unsharded = make_backend(model, "megatron", **dp, megatron_use_distributed_optimizer=False)
    unsharded.setup(rank, world_size, "cpu")
    try:
        unsharded.load_checkpoint(Path(out) / "ckpt")
    except ValueError as error:
        result["refused"] = str(error)
    unsharded.close()
    torch.save(result, Path(out) / f"resumed{rank}.pt")
    destroy_process_group()


def assert_disjoint_halves(shards: list[dict[str, Any]]) -> None:
    """Each data-parallel rank keeps the states of its own parameters: disjoint, covering all, about half each."""
    numels = shards[0]["param_numels"]
    owned = [set(s["owned"]) for s in shards]
    assert owned[0].isdisjoint(owned[1]) and owned[0] | owned[1] == set(range(len(numels)))
    total = sum(numels)
    for shard, mine in zip(shards, owned, strict=True):
        assert shard["state_numel"] == sum(numels[i] for i in mine)
        # whole parameters, largest first to the emptier rank: at most half plus the largest parameter
        assert 0 < shard["state_numel"] <= total / 2 + max(numels), (shard["state_numel"], total)


def assert_same_steps(got: dict[str, Any], want: dict[str, Any]) -> None:
    for mine, reference in zip(got["steps"], want["steps"], strict=True):
        assert mine["metrics"]["learning_rate"] == reference["metrics"]["learning_rate"]
        assert_same_step(mine, reference)


@pytest.mark.slow
def test_dp2_sharded_optimizer_equals_fsdp_and_resumes_exactly(tiny_model: Path, tmp_path: Path) -> None:
    spawn_ranks(dp2_worker, 2, str(tiny_model), str(tmp_path))
    results = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(2)]
    fsdp = train(str(tiny_model), "fsdp", **FSDP_SCHEDULE)
    rates = [step["metrics"]["learning_rate"] for step in fsdp["steps"]]
    assert rates[0] != rates[1], "the schedule should change the learning rate between the steps"
    for result in results:
        assert_same_steps(result["sharded"], fsdp)
        assert_same_steps(result["unsharded"], fsdp)
        for mine, reference in zip(result["sharded"]["steps"], result["unsharded"]["steps"], strict=True):
            for name, tensor in reference["after"].items():  # the same AdamW update, only elsewhere
                torch.testing.assert_close(mine["after"][name], tensor, atol=1e-7, rtol=0, msg=name)
    assert_disjoint_halves([r["sharded"]["shard"] for r in results])
    unsharded = results[0]["unsharded"]["shard"]
    assert unsharded["state_numel"] == sum(unsharded["param_numels"])  # without it: every state on every rank

    # the warm start's optimizer is sharded as well
    want = supervised(str(tiny_model), "fsdp")
    for result in results:
        assert result["supervised"]["losses"] == pytest.approx(want["losses"], rel=1e-5)
        for name, tensor in want["after"].items():  # two Adam steps at lr 1e-2: 1% of it (test_training)
            torch.testing.assert_close(result["supervised"]["after"][name], tensor, atol=1e-4, rtol=0, msg=name)

    # each rank saved its own shard; resumed in fresh processes, the second step is the uninterrupted one
    shards = sorted((tmp_path / "ckpt" / "optimizer").iterdir())
    assert [p.name for p in shards] == ["rank_0.pt", "rank_1.pt"]
    saved = [torch.load(p, weights_only=False) for p in shards]
    assert all(s["sharded"] for s in saved)
    assert {len(s["local"]["state"]) for s in saved} == {len(r["sharded"]["shard"]["owned"]) for r in results}
    spawn_ranks(resume_worker, 2, str(tiny_model), str(tmp_path))
    for rank, result in enumerate(results):
        resumed = torch.load(tmp_path / f"resumed{rank}.pt", weights_only=False)
        assert resumed["step"] == 1 and resumed["sharded"]
        uninterrupted = result["sharded"]["steps"][1]
        assert resumed["metrics"]["learning_rate"] == uninterrupted["metrics"]["learning_rate"]
        assert resumed["metrics"]["loss"] == uninterrupted["metrics"]["loss"]
        for name, tensor in uninterrupted["after"].items():
            assert torch.equal(resumed["after"][name], tensor), name
        assert "megatron_use_distributed_optimizer" in resumed["refused"]


def dp2_tp2_worker(rank: int, world_size: int, model: str, out: str) -> None:
    from telescope.trainer.distributed import destroy_process_group, init_process_group

    init_process_group(rank, world_size, torch.device("cpu"))
    tp = {"trainer_num_workers": world_size, "megatron_tensor_parallel_size": 2, **SCHEDULE}
    result = train(model, "megatron", rank, world_size, **tp)
    torch.save(result, Path(out) / f"rank{rank}.pt")
    destroy_process_group()


@pytest.mark.slow
def test_dp2_tp2_sharded_optimizer_equals_fsdp(tiny_model: Path, tmp_path: Path) -> None:
    spawn_ranks(dp2_tp2_worker, 4, str(tiny_model), str(tmp_path))
    results = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(4)]
    fsdp = train(str(tiny_model), "fsdp", **FSDP_SCHEDULE)
    for result in results:
        assert_same_steps(result, fsdp)
    # megatron-core's rank order is tp-cp-ep-dp-pp: ranks 0 and 2 hold tensor-parallel shard 0, 1 and 3 shard 1
    for tp_rank in (0, 1):
        assert_disjoint_halves([results[tp_rank]["shard"], results[tp_rank + 2]["shard"]])
