"""Mixed precision in the megatron backend: the dtypes after a step, bf16 against FSDP's bf16, exact resumes.

Dtypes: after one step, for the default (``mixed_precision_dtype: bfloat16`` over float32
weights: bfloat16 model parameters, float32 main parameters, gradient buffers, main
gradients and Adam moments) and for every other value of each dtype setting, the
model's parameters, the main parameters, the gradients (buffers and main gradients, as
the optimizer sees them) and Adam's moments are each in the dtype asked; the model's
parameters are their main parameters rounded, and the weights sent to inference are the
main parameters in ``model_dtype``.

FSDP: see :func:`test_bf16_steps_equal_fsdp_bf16_steps` (measured differences there).

Checkpoints: a resume after one step gives, after the second, exactly the main
parameters and Adam's moments of two uninterrupted steps: with float32 ``model_dtype``
(the Hugging Face file holds the float32 main parameters) and with bfloat16
``model_dtype`` (the float32 main parameters come from the rank's precision file);
and, slow, at DP 2 with the distributed optimizer (its shards and the main parameters).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.megatron.test_distributed_optimizer import batch, train
from tests.megatron.test_training import make_backend

from telescope.testing.trainer import spawn_ranks, synthetic_batch, weights_snapshot

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
PLAIN = {"megatron_gradient_checkpointing": False}
AWARE = {"megatron_use_precision_aware_optimizer": True}


def dtypes_after_a_step(model: str, **overrides: Any) -> dict[str, Any]:
    """One step; the dtypes (as sets over the parameters) of everything precision touches, and consistency checks."""
    from telescope_megatron.loss_scaling import DynamicLossScale
    from telescope_megatron.optimizer import local_optimizer, main_grad

    backend = make_backend(model, "megatron", **PLAIN, **overrides)
    backend.setup(0, 1, "cpu")
    if backend.loss_scaler is not None:  # type: ignore[attr-defined]
        # float16: start where this model's gradients do not overflow (megatron-core's 2**32 skips the first steps)
        backend.loss_scaler = DynamicLossScale(scale=1024.0)  # type: ignore[attr-defined]
    main = backend.main  # type: ignore[attr-defined]
    names = list(main.params)
    seen: dict[str, Any] = {}
    optimizer = backend.optimizer  # type: ignore[attr-defined]
    step = optimizer.step

    def recording_step(*args: Any, **kwargs: Any) -> Any:
        seen["buffers"] = {main.accumulated(n).dtype for n in names if main.accumulated(n) is not None}
        seen["main_grads"] = {main_grad(p).dtype for p in main.parameters() if main_grad(p) is not None}
        return step(*args, **kwargs)

    optimizer.step = recording_step
    start = {n: p.detach().clone() for n, p in main.params.items()}
    metrics = backend.train_step(synthetic_batch())
    states = local_optimizer(optimizer).state.values()
    weights = dict(backend.named_weights())
    out = {
        **seen,
        "model": {p.dtype for p in backend.model.parameters()},  # type: ignore[attr-defined]
        "main": {p.dtype for p in main.parameters()},
        "main_is_model": {main.params[n] is main.model[n] for n in names},
        "exp_avg": {s["exp_avg"].dtype for s in states},
        "exp_avg_sq": {s["exp_avg_sq"].dtype for s in states},
        "states": len(states),
        "weights": {t.dtype for t in weights.values()},
        "skipped": metrics["optimizer/skipped_steps"],
        "loss_scale": metrics.get("optimizer/loss_scale"),
        # the model's parameters are their main parameters rounded; the main parameters moved
        "rounded": all(torch.equal(main.model[n], main.params[n].to(main.model[n].dtype)) for n in names),
        "moved": max(float((main.params[n].float() - start[n].float()).abs().max()) for n in names),
        "hf_weights_are_main": _weights_are_main(backend, weights),
    }
    backend.close()
    return out


def _weights_are_main(backend: Any, weights: dict[str, torch.Tensor]) -> bool:
    """``named_weights`` holds the main parameters cast to ``model_dtype`` (checked on the final norm, unsplit)."""
    hf, megatron = "model.norm.weight", "decoder.final_layernorm.weight"
    return torch.equal(weights[hf], backend.main.params[megatron].detach().to(weights[hf].dtype))


#: The config's default (tiny_trainer_config turns mixed precision off).
CONFIG_DEFAULT = {"mixed_precision_dtype": "bfloat16"}
#: (overrides, expected): every dtype setting at every value it accepts, besides the default.
CASES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({}, {"model": BF16, "main": FP32, "buffers": FP32, "main_grads": FP32, "moments": (FP32, FP32), "weights": FP32}),
    (  # no mixed precision: everything float32, the main parameters are the model's
        {"mixed_precision_dtype": None},
        {"model": FP32, "main": FP32, "buffers": FP32, "main_grads": FP32, "moments": (FP32, FP32), "weights": FP32},
    ),
    (  # bfloat16 weights, no mixed precision: bfloat16 compute, float32 main parameters and moments
        {"model_dtype": "bfloat16", "mixed_precision_dtype": None},
        {"model": BF16, "main": FP32, "buffers": FP32, "main_grads": FP32, "moments": (FP32, FP32), "weights": BF16},
    ),
    (  # float16 compute: the loss scaled
        {"mixed_precision_dtype": "float16"},
        {"model": FP16, "main": FP32, "buffers": FP32, "main_grads": FP32, "moments": (FP32, FP32), "weights": FP32},
    ),
    (  # gradients accumulated and reduced in the compute dtype, then float32 main gradients
        {"megatron_grad_reduce_in_fp32": False},
        {"model": BF16, "main": FP32, "buffers": BF16, "main_grads": FP32, "moments": (FP32, FP32), "weights": FP32},
    ),
    (
        {
            **AWARE,
            "megatron_main_params_dtype": "float16",
            "megatron_main_grads_dtype": "bfloat16",
            "megatron_exp_avg_dtype": "bfloat16",
            "megatron_exp_avg_sq_dtype": "float16",
        },
        {"model": BF16, "main": FP16, "buffers": FP32, "main_grads": BF16, "moments": (BF16, FP16), "weights": FP32},
    ),
    (  # bfloat16 main parameters are the model's own
        {
            **AWARE,
            "megatron_main_params_dtype": "bfloat16",
            "megatron_main_grads_dtype": "float16",
            "megatron_exp_avg_dtype": "float16",
            "megatron_exp_avg_sq_dtype": "bfloat16",
        },
        {"model": BF16, "main": BF16, "buffers": FP32, "main_grads": FP16, "moments": (FP16, BF16), "weights": FP32},
    ),
]


@pytest.mark.parametrize(("overrides", "want"), CASES, ids=[str(o or "default") for o, _ in CASES])
def test_dtypes_after_a_step(tiny_model: Path, overrides: dict[str, Any], want: dict[str, Any]) -> None:
    got = dtypes_after_a_step(str(tiny_model), **{**CONFIG_DEFAULT, **overrides})
    assert got["model"] == {want["model"]}
    assert got["main"] == {want["main"]}
    assert got["main_is_model"] == {want["main"] == want["model"]}
    assert got["buffers"] == {want["buffers"]}
    assert got["main_grads"] == {want["main_grads"]}
    assert (got["exp_avg"], got["exp_avg_sq"]) == ({want["moments"][0]}, {want["moments"][1]})
    assert got["states"] > 0 and got["skipped"] == 0.0 and got["moved"] > 0
    assert got["rounded"], "the model's parameters are not their main parameters rounded"
    assert got["weights"] == {want["weights"]} and got["hf_weights_are_main"]
    assert (got["loss_scale"] is not None) == (want["model"] == FP16)


def test_bf16_steps_equal_fsdp_bf16_steps(tiny_model: Path) -> None:
    """Two steps at ``mixed_precision_dtype: bfloat16`` over float32 weights: megatron's equal FSDP's.

    Both compute in bfloat16 but round at different places (RMSNorm, RoPE, attention),
    so their gradients differ by bfloat16 noise. Measured (tiny Qwen2, CPU; step 1, step 2):
    the gradient norm 4.7e-4, 7.1e-4 relative; the loss 4.2e-3, 2.0e-3 relative; the
    applied gradients 5.4e-3, 9.7e-3 in relative L2 over the model; the weights (AdamW
    moves each by about lr x sign(g), so a tiny gradient whose sign differs moves it the
    other way) beyond 1e-5 in 0.31% of the elements after step 1, by at most 2.0e-3
    (2 x lr) after step 1 and 3.2e-3 after step 2. Held to (:func:`assert_bf16_steps_close`):
    the norm 2e-3, the loss 1e-2, the gradients 2e-2, the weights 1% beyond 1e-5 after
    step 1 and 2 x lr per step. At this size FSDP's float32 step is as close to its bf16
    one (norm 1.8e-3, gradients 6.0e-3), so this comparison does not tell the compute
    dtype (:func:`test_dtypes_after_a_step` does); it checks the path around it: a
    missing copy of the main parameters into the model, bfloat16 master weights or
    gradients not clipped each fail it (checked by hand on this model).
    """
    fsdp = train(str(tiny_model), "fsdp", mixed_precision_dtype="bfloat16")
    megatron = train(str(tiny_model), "megatron", **PLAIN, mixed_precision_dtype="bfloat16")
    assert_bf16_steps_close(megatron, fsdp)


def assert_bf16_steps_close(megatron: dict[str, Any], fsdp: dict[str, Any], lr: float = 1e-3) -> None:
    """The tolerances of :func:`test_bf16_steps_equal_fsdp_bf16_steps`, step by step."""
    for step, (mine, theirs) in enumerate(zip(megatron["steps"], fsdp["steps"], strict=True), start=1):
        assert mine["metrics"]["grad_norm"] == pytest.approx(theirs["metrics"]["grad_norm"], rel=2e-3), step
        assert mine["metrics"]["loss"] == pytest.approx(theirs["metrics"]["loss"], rel=1e-2), step
        assert relative_l2(mine["gradients"], theirs["gradients"]) <= 2e-2, step
        beyond = total = 0
        for name, weight in theirs["after"].items():
            difference = (mine["after"][name] - weight).abs()
            assert float(difference.max()) <= 2 * lr * step + 1e-6, (step, name)
            beyond, total = beyond + int((difference > 1e-5).sum()), total + weight.numel()
        if step == 1:
            assert beyond <= 0.01 * total, beyond / total


def relative_l2(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    assert list(got) == list(want)
    difference = sum(float((got[k] - want[k]).pow(2).sum()) for k in want)
    return (difference / sum(float(want[k].pow(2).sum()) for k in want)) ** 0.5


def main_state(backend: Any) -> dict[str, Any]:
    """The main parameters and Adam's moments, by name (copies)."""
    from telescope_megatron.optimizer import local_optimizer

    state = local_optimizer(backend.optimizer).state
    out: dict[str, Any] = {}
    for name, param in backend.main.params.items():
        out[name] = param.detach().clone()
        if param in state:
            out[f"{name}/exp_avg"] = state[param]["exp_avg"].clone()
            out[f"{name}/exp_avg_sq"] = state[param]["exp_avg_sq"].clone()
    return out


def assert_identical(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


@pytest.mark.parametrize("model_dtype", ["float32", "bfloat16"])
def test_a_resume_restores_the_main_parameters_exactly(tiny_model: Path, tmp_path: Path, model_dtype: str) -> None:
    settings = {**PLAIN, "model_dtype": model_dtype, "lr_scheduler": "constant", "warmup_steps": 3}
    backend = make_backend(str(tiny_model), "megatron", **settings)
    backend.setup(0, 1, "cpu")
    backend.train_step(batch(0))
    backend.save_checkpoint(tmp_path / "ckpt", training_state=True)
    backend.train_step(batch(1))
    uninterrupted, weights = main_state(backend), weights_snapshot(backend)
    backend.close()
    saved = torch.load(tmp_path / "ckpt" / "precision" / "rank_0.pt", weights_only=False)
    # float32 weights hold the float32 main parameters; bfloat16 ones cannot, so the rank's file does
    assert (saved["main_params"] is not None) == (model_dtype == "bfloat16")

    resumed = make_backend(str(tiny_model), "megatron", **settings)
    resumed.setup(0, 1, "cpu")
    resumed.load_checkpoint(tmp_path / "ckpt")
    resumed.train_step(batch(1))
    assert_identical(main_state(resumed), uninterrupted)
    assert_identical(weights_snapshot(resumed), weights)
    model = resumed.main.model  # type: ignore[attr-defined]
    assert all(torch.equal(p, resumed.main.params[n].to(p.dtype)) for n, p in model.items())  # type: ignore[attr-defined]
    resumed.close()


def dp2_worker(rank: int, world_size: int, model: str, out: str) -> None:
    """DP 2, bfloat16 compute, the distributed optimizer: two steps, sharded and not; one step and a checkpoint."""
    from telescope.trainer.distributed import destroy_process_group, init_process_group

    init_process_group(rank, world_size, torch.device("cpu"))
    dp = {"trainer_num_workers": world_size, "model_dtype": "bfloat16", **PLAIN}
    result = {
        "sharded": train(model, "megatron", rank, world_size, **dp),
        "unsharded": train(model, "megatron", rank, world_size, **dp, megatron_use_distributed_optimizer=False),
    }
    backend = make_backend(model, "megatron", **dp)
    backend.setup(rank, world_size, "cpu")
    for step in range(2):
        backend.train_step(batch(step))
        if step == 0:
            backend.save_checkpoint(Path(out) / "ckpt", training_state=True)
    result["uninterrupted"] = main_state(backend)
    backend.close()
    torch.save(result, Path(out) / f"rank{rank}.pt")
    destroy_process_group()


def dp2_resume_worker(rank: int, world_size: int, model: str, out: str) -> None:
    from telescope.trainer.distributed import destroy_process_group, init_process_group

    init_process_group(rank, world_size, torch.device("cpu"))
    backend = make_backend(model, "megatron", trainer_num_workers=world_size, model_dtype="bfloat16", **PLAIN)
    backend.setup(rank, world_size, "cpu")
    backend.load_checkpoint(Path(out) / "ckpt")
    backend.train_step(batch(1))
    torch.save(main_state(backend), Path(out) / f"resumed{rank}.pt")
    backend.close()
    destroy_process_group()


@pytest.mark.slow
def test_dp2_distributed_optimizer_with_main_parameters_resumes_exactly(tiny_model: Path, tmp_path: Path) -> None:
    """bfloat16 weights and compute, float32 main parameters sharded by ZeRO: the unsharded update, exact resume."""
    spawn_ranks(dp2_worker, 2, str(tiny_model), str(tmp_path))
    results = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(2)]
    for result in results:
        for mine, reference in zip(result["sharded"]["steps"], result["unsharded"]["steps"], strict=True):
            assert mine["metrics"]["grad_norm"] == reference["metrics"]["grad_norm"]
            for name, tensor in reference["after"].items():  # the same update, only elsewhere
                assert torch.equal(mine["after"][name], tensor), name
    # each rank kept float32 moments of its own main parameters only
    owned = [{k for k in r["uninterrupted"] if k.endswith("/exp_avg")} for r in results]
    assert owned[0] and owned[1] and owned[0].isdisjoint(owned[1])
    assert {r["uninterrupted"][k].dtype for r in results for k in r["uninterrupted"]} == {torch.float32}
    spawn_ranks(dp2_resume_worker, 2, str(tiny_model), str(tmp_path))
    for rank, result in enumerate(results):
        assert_identical(torch.load(tmp_path / f"resumed{rank}.pt", weights_only=False), result["uninterrupted"])
