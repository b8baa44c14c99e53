"""The fsdp backend through the trainer conformance kit, plus fsdp-specific behaviour."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from telescope.api.algorithm import LossInputs
from telescope.api.context import TrainerContext
from telescope.api.records import TrainingSample
from telescope.plugins.facade import get_plugins
from telescope.testing.trainer import (
    TrainerBackendConformance,
    synthetic_batch,
    tiny_trainer_config,
    weights_snapshot,
)
from telescope.trainer.fsdp import FSDPBackend
from telescope.trainer.metrics import TIMED_SECTIONS
from telescope.trainer.packing import split_minibatches
from telescope.trainer.plugin import FSDPSettings


class TestFSDPBackend(TrainerBackendConformance):
    backend_name = "fsdp"


def started(model: Path, **overrides: object) -> FSDPBackend:
    config = tiny_trainer_config(model, **overrides)
    backend = get_plugins().create_trainer_backend(config, get_plugins().create_algorithm(config))
    backend.setup()
    return backend


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "dr_grpo", "reinforce_pp", "cispo", "gspo", "sapo"])
def test_every_algorithm_trains(tiny_model: Path, algorithm: str) -> None:
    backend = started(tiny_model, algorithm=algorithm)
    try:
        before = weights_snapshot(backend)
        metrics = backend.train_step(synthetic_batch())
        after = weights_snapshot(backend)
    finally:
        backend.close()
    assert metrics["loss"] == metrics["loss"] and metrics["grad_norm"] > 0
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_minibatches_count_optimizer_steps(tiny_model: Path) -> None:
    backend = started(
        tiny_model, number_of_minibatches=2, use_ppo_clip=True, ppo_clip_ref_logprobs="batch", use_tis=True
    )
    try:
        metrics = backend.train_step(synthetic_batch(num_groups=4))
    finally:
        backend.close()
    assert metrics["optimizer/steps"] == 2.0


def test_tis_weight_uses_the_batch_reference_after_the_first_optimizer_step(tiny_model: Path) -> None:
    """Two minibatches: on the second, the policy has moved and the TIS weight is pi_old / pi_inf.

    pi_old is computed here with plain transformers on the initial weights, one sample at a time.
    Each loss token gets a distinct rollout log-probability lp_old - u (u uniform in [-0.6, 0.6]), so
    the weight exp(u) sometimes exceeds the cap 1.5, and the rollout value identifies the token.
    """
    from transformers import AutoModelForCausalLM

    from telescope.api.records import TrainingBatch

    cap = 1.5
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    rng = random.Random(7)
    old_by_rollout: dict[float, float] = {}
    samples: list[TrainingSample] = []
    for s in synthetic_batch(num_groups=2, seed=5).samples:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([s.token_ids])).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)[:-1].gather(-1, torch.tensor(s.token_ids[1:]).unsqueeze(-1))
        rollout_lp = [0.0] * len(s.token_ids)
        for t in range(1, len(s.token_ids)):
            if s.loss_mask[t]:
                old_lp = float(logp[t - 1])
                rollout_lp[t] = float(torch.tensor(old_lp - rng.uniform(-0.6, 0.6), dtype=torch.float32))
                old_by_rollout[rollout_lp[t]] = old_lp
        samples.append(dataclasses.replace(s, inference_logprobs=rollout_lp))
    batch = TrainingBatch(samples=samples, step=0, policy_version=0)

    backend = started(
        tiny_model,
        number_of_minibatches=2,
        use_ppo_clip=True,
        ppo_clip_ref_logprobs="batch",
        use_tis=True,
        tis_cap=cap,
        learning_rate=1e-2,
    )
    calls: list[tuple[LossInputs, torch.Tensor]] = []
    original = backend.algorithm.loss_terms

    def spy(inputs: LossInputs) -> torch.Tensor:
        terms = original(inputs)
        calls.append((inputs, terms.detach().clone()))
        return terms

    backend.algorithm.loss_terms = spy  # type: ignore[method-assign]
    try:
        backend.train_step(batch)
        clip_low, clip_high, clamp = (
            backend.algorithm.config.clip_low,
            backend.algorithm.config.clip_high,
            backend.algorithm.config.tis_logprob_clamp,
        )
    finally:
        backend.close()
    assert len(calls) == 2  # one packed sequence per minibatch

    def golden(
        lp: torch.Tensor, old: torch.Tensor, weight_lp: torch.Tensor, rollout: torch.Tensor, adv: torch.Tensor
    ) -> torch.Tensor:
        """PPO clip on lp / old, times min(exp(clamp(weight_lp - rollout)), cap)."""
        rho = torch.exp(lp - old)
        ppo = torch.maximum(-rho * adv, -rho.clamp(1 - clip_low, 1 + clip_high) * adv)
        return ppo * torch.exp((weight_lp - rollout).clamp(-clamp, clamp)).clamp(max=cap)

    for minibatch, (inputs, terms) in enumerate(calls):
        mask = inputs.loss_mask
        rollout = inputs.inference_logprobs[mask].double()
        old = torch.tensor([old_by_rollout[float(v)] for v in inputs.inference_logprobs[mask]], dtype=torch.float64)
        lp = inputs.logprobs.detach()[mask].double()
        adv = inputs.advantages[mask].double()
        assert torch.allclose(inputs.ref_logprobs[mask].double(), old, atol=1e-5)  # the batch reference is pi_old
        assert torch.allclose(terms[mask].double(), golden(lp, old, old, rollout, adv), atol=1e-5)
        moved = float((lp - old).abs().max())
        if minibatch == 0:
            assert moved < 1e-5
        else:  # after one optimizer step the current policy's weight would differ
            assert moved > 1e-3
            assert not torch.allclose(terms[mask].double(), golden(lp, old, lp, rollout, adv), atol=1e-4)


def test_custom_backend_adds_metrics(tiny_model: Path) -> None:
    class MyBackend(FSDPBackend):
        def train_step(self, batch):  # type: ignore[no-untyped-def]
            metrics = super().train_step(batch)
            metrics["custom/my_metric"] = 1.0
            return metrics

    config = tiny_trainer_config(tiny_model)
    backend = MyBackend(
        TrainerContext.from_config(config), get_plugins().create_algorithm(config), config.settings(FSDPSettings)
    )
    backend.setup()
    try:
        assert backend.train_step(synthetic_batch())["custom/my_metric"] == 1.0
    finally:
        backend.close()


def test_gradient_checkpointing_and_bf16_mixed_precision_run_on_cpu(tiny_model: Path) -> None:
    backend = started(tiny_model, gradient_checkpointing=True, mixed_precision_dtype="bfloat16")
    try:
        metrics = backend.train_step(synthetic_batch())
    finally:
        backend.close()
    assert metrics["grad_norm"] > 0 and metrics["entropy"] > 0


def test_one_rank_trains_the_plain_module_exactly_as_fsdp_would(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rank with no dtype cast skips ``fully_shard``; two steps give FSDP's weights and metrics."""
    from torch.distributed.tensor import DTensor

    def two_steps() -> tuple[dict[str, torch.Tensor], list[dict[str, float]], bool]:
        backend = started(tiny_model)
        try:
            sharded = any(isinstance(p, DTensor) for p in backend.model.parameters())
            metrics = [backend.train_step(synthetic_batch(step=step, seed=step)) for step in range(2)]
            return weights_snapshot(backend), metrics, sharded
        finally:
            backend.close()

    plain_weights, plain_metrics, plain_sharded = two_steps()
    monkeypatch.setattr(FSDPBackend, "_needs_fsdp", lambda self: True)
    fsdp_weights, fsdp_metrics, fsdp_sharded = two_steps()
    assert not plain_sharded and fsdp_sharded
    for name, value in fsdp_weights.items():
        torch.testing.assert_close(plain_weights[name], value, rtol=1e-5, atol=1e-6)
    for plain, fsdp in zip(plain_metrics, fsdp_metrics, strict=True):
        for key in ("loss", "grad_norm", "entropy"):
            assert plain[key] == pytest.approx(fsdp[key], rel=1e-5)


def test_a_mixed_precision_cast_keeps_fsdp_on_one_rank(tiny_model: Path) -> None:
    from torch.distributed.tensor import DTensor

    backend = started(tiny_model, mixed_precision_dtype="bfloat16")  # float32 weights, bf16 compute
    try:
        assert all(isinstance(p, DTensor) for p in backend.model.parameters())
    finally:
        backend.close()


def test_truncated_samples_are_counted(tiny_model: Path) -> None:
    batch = synthetic_batch(prompt_length=10, completion_lengths=(60, 60))  # 70 tokens > seq_len 64
    backend = started(tiny_model)
    try:
        metrics = backend.train_step(batch)
    finally:
        backend.close()
    assert metrics["packing/truncated_samples"] == 4.0


# ----------------------------------------------- the batch ratio reference (PPO clip)

#: PPO clipping whose ratio reference is what the test says; no TIS, so the loss is the clipped ratio alone.
CLIP_LOW, CLIP_HIGH = 0.4, 0.5
PPO: dict[str, Any] = {
    "algorithm": "grpo",
    "use_ppo_clip": True,
    "use_tis": False,
    "clip_low": CLIP_LOW,
    "clip_high": CLIP_HIGH,
}
#: Rollout log-probability of every completion token: far above the untrained model's (about -log 384 = -6).
FAR_ROLLOUT_LOGPROB = -0.05


def far_rollout_samples(num_groups: int = 2) -> list[TrainingSample]:
    """Synthetic samples whose rollout log-probabilities are far from the model's (ratio ~ e^-6 against them)."""
    samples = synthetic_batch(num_groups=num_groups).samples
    return [replace(s, inference_logprobs=[FAR_ROLLOUT_LOGPROB if m else 0.0 for m in s.loss_mask]) for s in samples]


def hf_model(path: Path, weights: dict[str, torch.Tensor] | None = None) -> Any:
    """The plain Hugging Face model (float32, eval: no dropout), optionally with other weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if weights is not None:
        model.load_state_dict(weights, strict=False)
    return model.eval()


def sample_logprobs(model: Any, sample: TrainingSample) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(token t+1 | tokens <= t) for the sample alone, and the mask of the loss targets."""
    ids = torch.tensor([sample.token_ids])
    logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    return logprobs, torch.tensor(sample.loss_mask[1:])


def hand_ppo_gradient(
    model: Any, samples: list[TrainingSample], reference: Callable[[int, torch.Tensor], torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Gradient of sum over loss tokens of max(-rho A, -clip(rho, 0.6, 1.5) A) / (loss tokens), rho = exp(lp - ref).

    ``reference(i, lp)`` gives sample i's ratio reference (a constant) from its log-probabilities ``lp``.
    """
    model.zero_grad(set_to_none=True)
    total = torch.zeros((), dtype=torch.float32)
    tokens = 0
    for i, sample in enumerate(samples):
        lp, mask = sample_logprobs(model, sample)
        ratio = torch.exp(lp - reference(i, lp.detach()))
        clipped = ratio.clamp(1 - CLIP_LOW, 1 + CLIP_HIGH)
        per_token = torch.maximum(-ratio * sample.advantage, -clipped * sample.advantage)
        total = total + per_token[mask].sum()
        tokens += int(mask.sum())
    (total / tokens).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def backend_gradient(model: Path, samples: list[TrainingSample], **overrides: object) -> dict[str, torch.Tensor]:
    backend = started(model, **PPO, **overrides)
    try:
        backend.accumulate_gradients(samples)
        return backend.full_gradients()
    finally:
        backend.close()


def assert_gradients_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(expected) <= set(actual)
    for name, grad in expected.items():
        torch.testing.assert_close(actual[name], grad, rtol=1e-4, atol=1e-6, msg=f"gradient of {name} differs")


def relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    diff = sum(float((a[k] - b[k]).pow(2).sum()) for k in b) ** 0.5
    return diff / max(sum(float(b[k].pow(2).sum()) for k in b) ** 0.5, 1e-12)


def test_batch_reference_uses_the_trainers_own_logprobs(tiny_model: Path) -> None:
    """ppo_clip_ref_logprobs: batch -> rho = 1 at the start (gradient -A grad lp), not rho vs the rollout."""
    samples = far_rollout_samples()
    batch = backend_gradient(tiny_model, samples, ppo_clip_ref_logprobs="batch")
    rollout = backend_gradient(tiny_model, samples, ppo_clip_ref_logprobs="rollout")

    model = hf_model(tiny_model)
    own = hand_ppo_gradient(model, samples, lambda i, lp: lp)
    far = hand_ppo_gradient(
        model, samples, lambda i, lp: torch.tensor(samples[i].inference_logprobs[1:], dtype=torch.float32)
    )
    assert_gradients_close(batch, own)
    assert_gradients_close(rollout, far)
    # rho ~ e^-6 against the rollout: those gradients are tiny or clipped to 0; the batch ones are not.
    assert relative_difference(rollout, batch) > 0.5


def test_batch_reference_is_taken_before_the_first_optimizer_step(tiny_model: Path) -> None:
    """With 2 minibatches, the second one's reference is the *initial* model's log-probabilities."""
    batch = synthetic_batch(num_groups=4)
    batch.samples[:] = far_rollout_samples(num_groups=4)
    backend = started(tiny_model, **PPO, ppo_clip_ref_logprobs="batch", number_of_minibatches=2, learning_rate=5e-3)
    recorded: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = []
    optimizer_step = backend._optimizer_step

    def recording_step() -> float:  # the minibatch's gradient (before clipping) and the weights it was taken at
        recorded.append((backend.full_gradients(), weights_snapshot(backend)))
        return optimizer_step()

    backend._optimizer_step = recording_step  # type: ignore[method-assign]
    try:
        backend.train_step(batch)
    finally:
        backend.close()
    assert len(recorded) == 2
    first, second = split_minibatches(batch.samples, 2)
    initial = hf_model(tiny_model)
    with torch.no_grad():
        initial_logprobs = [sample_logprobs(initial, s)[0] for s in second]
    stepped = hf_model(tiny_model, recorded[1][1])
    grads, _ = recorded[1]
    expected = hand_ppo_gradient(stepped, second, lambda i, lp: initial_logprobs[i])
    assert_gradients_close(grads, expected)
    # The step moved the model enough that a reference recomputed after it (rho = 1) would be told apart.
    lazy = hand_ppo_gradient(stepped, second, lambda i, lp: lp)
    assert relative_difference(lazy, expected) > 1e-2
    assert_gradients_close(recorded[0][0], hand_ppo_gradient(initial, first, lambda i, lp: lp))


# ------------------------------------------------------------- gradient checkpointing


def mlp_calls_during_gradient(tiny_model: Path, checkpointing: bool) -> tuple[list[int], int, dict[str, Any]]:
    """Runs of each decoder layer's MLP in one forward/backward, the micro-batch count, and the gradients.

    The MLP's ``forward`` is wrapped on the instance (module hooks are not used: transformers
    does not fire them again in the recomputation), so every execution is counted.
    """
    backend = started(tiny_model, gradient_checkpointing=checkpointing)
    calls = [0] * len(backend._decoder_layers())

    def counting(index: int, forward: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            calls[index] += 1
            return forward(*args, **kwargs)

        return run

    try:
        model = backend.model  # transformers >= 5.2x names it is_activation_checkpointing
        enabled = getattr(model, "is_activation_checkpointing", None)
        assert (model.is_gradient_checkpointing if enabled is None else enabled) is checkpointing
        for i, layer in enumerate(backend._decoder_layers()):
            mlp: Any = layer.mlp
            mlp.forward = counting(i, mlp.forward)
        samples = synthetic_batch().samples
        microbatches = len(backend._local_sequences(backend._pack(samples)))
        backend.accumulate_gradients(samples)
        grads = backend.full_gradients()
    finally:
        backend.close()
    return calls, microbatches, grads


def test_gradient_checkpointing_recomputes_each_layer_in_backward(tiny_model: Path) -> None:
    plain_calls, microbatches, plain_grads = mlp_calls_during_gradient(tiny_model, checkpointing=False)
    checkpointed_calls, _, checkpointed_grads = mlp_calls_during_gradient(tiny_model, checkpointing=True)
    assert microbatches >= 1
    assert plain_calls == [microbatches] * len(plain_calls)
    assert checkpointed_calls == [2 * microbatches] * len(plain_calls)  # once forward, once recomputed in backward
    assert_gradients_close(checkpointed_grads, plain_grads)  # recomputation does not change the gradient


def test_phases_are_timeline_records_per_microbatch(tiny_model: Path) -> None:
    """With track_gpu_events every section of a step is a record (wall clock on the CPU) that adds up to its metric."""
    backend = started(tiny_model, number_of_minibatches=2, use_ppo_clip=True, ppo_clip_ref_logprobs="batch")
    try:
        [prewarm] = backend.drain_events()  # set-up's one forward and backward
        assert prewarm["kind"] == "trainer.prewarm" and prewarm["tokens"] == backend.context.seq_len
        wall = time.time()
        metrics = backend.train_step(synthetic_batch(num_groups=4))
        records = backend.drain_events()
        assert backend.drain_events() == []  # drained once
    finally:
        backend.close()
    kinds = {r["kind"] for r in records}
    assert kinds == {f"trainer.{s}" for s in TIMED_SECTIONS} | {"trainer.step"}
    assert all(r["clock"] == "wall" and wall <= r["start"] and r["duration_s"] >= 0 for r in records)
    forward = [r for r in records if r["kind"] == "trainer.forward" and not r.get("reference")]
    assert [r["microbatch"] for r in forward] == list(range(len(forward)))
    assert {r["minibatch"] for r in forward} == {0, 1}
    assert any(r.get("reference") for r in records if r["kind"] == "trainer.forward")  # the batch reference pass
    assert {r["minibatch"] for r in records if r["kind"] == "trainer.optimizer"} == {0, 1}
    for section in TIMED_SECTIONS:  # one rank: the records are the step's timing, split up
        total = sum(r["duration_s"] for r in records if r["kind"] == f"trainer.{section}")
        assert total == pytest.approx(metrics[f"timing_{section}_total"], rel=1e-9, abs=1e-12)
    [step] = [r for r in records if r["kind"] == "trainer.step"]
    assert step["microbatches"] == len(forward) and step["duration_s"] == metrics["timing_trainer_step_total"]
    assert all(step["start"] <= r["start"] <= step["start"] + step["duration_s"] for r in records)


def test_no_phase_records_without_track_gpu_events(tiny_model: Path) -> None:
    backend = started(tiny_model, track_gpu_events=False)
    try:
        metrics = backend.train_step(synthetic_batch())
        assert backend.drain_events() == []
    finally:
        backend.close()
    assert metrics["timing_forward_total"] > 0
