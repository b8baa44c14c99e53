"""The trainer's set-up prewarm: one forward and backward that changes nothing a run computes."""

from __future__ import annotations

from pathlib import Path

import torch

from telescope.plugins.facade import get_plugins
from telescope.testing.trainer import synthetic_batch, tiny_trainer_config, weights_snapshot
from telescope.trainer.fsdp import FSDPBackend
from telescope.trainer.microbatch import MicroBatch
from telescope.trainer.prewarm import DOCUMENT_TOKENS, prewarm, synthetic_row


def started(model: Path, **overrides: object) -> FSDPBackend:
    config = tiny_trainer_config(model, **overrides)
    backend = get_plugins().create_trainer_backend(config, get_plugins().create_algorithm(config))
    backend.setup()
    return backend


def two_steps(model: Path, prewarm: bool) -> tuple[list[dict[str, float]], dict[str, torch.Tensor], list[dict]]:
    backend = started(model, trainer_prewarm=prewarm, seq_len=512)
    try:
        events = backend.drain_events()
        grads = [p.grad for p in backend.model.parameters()]
        metrics = [backend.train_step(synthetic_batch(num_groups=3, step=s, seed=s)) for s in range(2)]
        weights = weights_snapshot(backend)
    finally:
        backend.close()
    assert all(g is None for g in grads)  # the prewarm's gradients were dropped
    return metrics, weights, events


def test_a_prewarmed_trainer_trains_exactly_as_one_without(tiny_model: Path) -> None:
    warm_metrics, warm_weights, warm_events = two_steps(tiny_model, prewarm=True)
    cold_metrics, cold_weights, cold_events = two_steps(tiny_model, prewarm=False)
    keys = ("loss", "grad_norm", "entropy", "kl_divergence_inference")
    assert [[m[k] for k in keys] for m in warm_metrics] == [[m[k] for k in keys] for m in cold_metrics]
    assert all(torch.equal(warm_weights[k], cold_weights[k]) for k in warm_weights)
    [record] = warm_events
    assert record["kind"] == "trainer.prewarm" and record["tokens"] == 512 and record["duration_s"] > 0
    assert cold_events == []


def test_the_prewarm_leaves_the_random_stream_alone() -> None:
    """A model with dropout draws random numbers in its forward; the run's stream must not move."""
    model = torch.nn.Linear(4, 7)

    def logits_with_dropout(row: MicroBatch) -> torch.Tensor:
        hidden = torch.nn.functional.one_hot(row.input_ids[0] % 4, 4).float()
        return torch.nn.functional.dropout(model(hidden), p=0.5, training=True)

    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    record = prewarm(model, logits_with_dropout, 300, vocab_size=7, device=torch.device("cpu"))
    assert torch.equal(torch.rand(4), expected)
    assert record["tokens"] == 300 and all(p.grad is None for p in model.parameters())


def test_the_synthetic_row_is_packed_documents_of_fixed_tokens() -> None:
    row = synthetic_row(2 * DOCUMENT_TOKENS + 10, vocab_size=50, device=torch.device("cpu"))
    positions = row.position_ids[0].tolist()
    starts = [i for i, p in enumerate(positions) if p == 0]
    assert starts == [0, DOCUMENT_TOKENS, 2 * DOCUMENT_TOKENS]  # two full documents and a 10-token one
    assert positions[-1] == 9 and row.input_ids.shape == (1, 2 * DOCUMENT_TOKENS + 10)
    assert int(row.input_ids.max()) < 50
    assert torch.equal(row.input_ids, synthetic_row(2 * DOCUMENT_TOKENS + 10, 50, torch.device("cpu")).input_ids)
