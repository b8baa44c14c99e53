"""The loss is normalised by a global token count: 1, 2 or 4 micro-batches, 1 or 2 ranks, one gradient.

Samples of different lengths (20, 16, 12, 10 tokens, so per-micro-batch means would
differ) are packed with seq_len 64, 32, 24 and 20: 1, 2, 3 and 4 packed sequences
(micro-batches). On 2 ranks (gloo, CPU) they are dealt across the ranks. The
accumulated gradient must be the same everywhere to float32 tolerance.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from telescope.api.records import TrainingSample
from telescope.testing.trainer import spawn_ranks, tiny_trainer_config

LENGTHS = (20, 16, 12, 10)


def samples() -> list[TrainingSample]:
    gen = torch.Generator().manual_seed(3)
    out = []
    for i, n in enumerate(LENGTHS):
        prompt = 3 + i
        tokens = torch.randint(3, 300, (n,), generator=gen).tolist()
        logprobs = [0.0] * prompt + (-torch.rand(n - prompt, generator=gen) * 4).tolist()
        mask = [False] * prompt + [True] * (n - prompt)
        out.append(TrainingSample(tokens, mask, logprobs, (-1.0) ** i * (i + 1) / 2, group_index=i // 2))
    return out


def gradients(model: Path, seq_len: int, algorithm: str, rank: int = 0, world_size: int = 1) -> dict:
    from telescope.plugins.facade import get_plugins

    config = tiny_trainer_config(
        model,
        seq_len=seq_len,
        pad_to_multiple_of=4,
        max_model_len=20,
        max_tokens=8,
        algorithm=algorithm,
        dr_grpo_loss_agg_mode="token_sum_norm",
    )
    backend = get_plugins().create_trainer_backend(config, get_plugins().create_algorithm(config))
    backend.setup(rank=rank, world_size=world_size)
    try:
        num_sequences = len(backend._local_sequences(backend._pack(samples())))
        backend.accumulate_gradients(samples())
        grads = backend.full_gradients()
    finally:
        backend.close()
    return {"grads": grads, "local_microbatches": num_sequences}


def two_rank_worker(rank: int, world_size: int, model: Path, seq_len: int, algorithm: str, out: Path) -> None:
    result = gradients(model, seq_len, algorithm, rank, world_size)
    torch.save(result, out / f"rank{rank}.pt")


def assert_same(a: dict, b: dict) -> None:
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("algorithm", ["grpo", "gspo", "dr_grpo"])
def test_microbatch_split_gives_same_gradient(tiny_model: Path, algorithm: str) -> None:
    reference = gradients(tiny_model, 64, algorithm)
    assert reference["local_microbatches"] == 1
    for seq_len, expected in ((32, 2), (20, 4)):
        other = gradients(tiny_model, seq_len, algorithm)
        assert other["local_microbatches"] == expected
        assert_same(reference["grads"], other["grads"])


@pytest.mark.slow
def test_two_ranks_give_same_gradient(tiny_model: Path, tmp_path: Path) -> None:
    reference = gradients(tiny_model, 64, "grpo")["grads"]
    for seq_len in (32, 20):  # 2 sequences: one per rank; 4 sequences: two per rank
        spawn_ranks(two_rank_worker, 2, tiny_model, seq_len, "grpo", tmp_path)
        for rank in (0, 1):
            result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
            assert result["local_microbatches"] == (1 if seq_len == 32 else 2)
            assert_same(reference, result["grads"])
