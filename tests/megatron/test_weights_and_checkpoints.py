"""Weights to inference and checkpoints: what the FSDP backend sends, and HF folders that load with equal logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.megatron.test_training import make_backend

from telescope.testing.trainer import spawn_ranks, synthetic_batch
from telescope.transports.memory import MemoryTransport

OVERRIDES = {"megatron_gradient_checkpointing": False}


def received(backend_weights: object, root: Path) -> list[tuple[str, str, tuple[int, ...], torch.Tensor]]:
    """Send ``backend_weights`` through the memory transport and return what a receiver gets."""
    sender, receiver = MemoryTransport(root=root, timeout_s=30), MemoryTransport(timeout_s=30)
    receiver.connect_receiver(sender.prepare_sender(1), rank=0)
    sender.send(backend_weights, version=1)  # type: ignore[arg-type]
    got = [(n, str(t.dtype), tuple(t.shape), t.clone()) for n, t in receiver.receive(1)]
    receiver.close()
    return got


def assert_same_tensors(got: list, want: list) -> None:
    assert [g[:3] for g in got] == [w[:3] for w in want], "names, order, dtypes or shapes differ"
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g[3], w[3]), g[0]


def fsdp_received(model: Path, root: Path) -> list:
    backend = make_backend(str(model), "fsdp")
    backend.setup(0, 1, "cpu")
    try:
        return received(backend.named_weights(), root)
    finally:
        backend.close()


def test_a_server_receives_what_fsdp_sends(tiny_model: Path, tmp_path: Path) -> None:
    backend = make_backend(str(tiny_model), "megatron", **OVERRIDES)
    backend.setup(0, 1, "cpu")
    try:
        got = received(backend.named_weights(), tmp_path / "megatron")
    finally:
        backend.close()
    assert_same_tensors(got, fsdp_received(tiny_model, tmp_path / "fsdp"))


def tp2_worker(rank: int, world_size: int, model: str, out: str) -> None:
    """TP 2: rank 0 sends the (gathered) weights; then a trained checkpoint is saved."""
    backend = make_backend(model, "megatron", megatron_tensor_parallel_size=2, trainer_num_workers=2, **OVERRIDES)
    backend.setup(rank, world_size, "cpu")
    weights = backend.named_weights()
    if rank == 0:
        torch.save(received(weights, Path(out) / "transport"), Path(out) / "received.pt")
    else:
        for _ in weights:  # the gathers are collective
            pass
    backend.train_step(synthetic_batch())
    backend.save_checkpoint(Path(out) / "ckpt", training_state=True)
    backend.close()


@pytest.mark.slow
def test_tp2_sends_what_fsdp_sends_and_its_checkpoint_converts(tiny_model: Path, tmp_path: Path) -> None:
    from telescope_megatron.model import packed_logits
    from transformers import AutoModelForCausalLM

    from telescope.trainer.convert import convert_checkpoint

    spawn_ranks(tp2_worker, 2, str(tiny_model), str(tmp_path))
    assert_same_tensors(torch.load(tmp_path / "received.pt"), fsdp_received(tiny_model, tmp_path / "fsdp"))
    assert sorted(p.name for p in (tmp_path / "ckpt" / "optimizer").iterdir()) == ["rank_0.pt", "rank_1.pt"]

    # the TP 2 checkpoint resumes at TP 1 (weights only: another layout) and converts to HF with equal logits
    backend = make_backend(str(tiny_model), "megatron", **OVERRIDES)
    backend.setup(0, 1, "cpu")
    with pytest.raises(ValueError, match="megatron_tensor_parallel_size 2"):
        backend.load_checkpoint(tmp_path / "ckpt")
    ids = torch.tensor([[1, 5, 9, 30, 2, 7]])
    with torch.no_grad():  # the weights were loaded before the refusal: compare them to the converted folder
        ours = packed_logits(backend.model, ids, torch.arange(6)[None])
    backend.close()
    out = convert_checkpoint(tmp_path / "ckpt", tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits[0], ours, atol=1e-5, rtol=0)
    untrained = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        assert not torch.allclose(untrained(input_ids=ids).logits[0], ours), "the checkpoint holds no training"


def test_checkpoint_converts_to_hf_with_equal_logits(tiny_model: Path, tmp_path: Path) -> None:
    from telescope_megatron.model import packed_logits
    from transformers import AutoModelForCausalLM

    from telescope.trainer.convert import convert_checkpoint

    backend = make_backend(str(tiny_model), "megatron", **OVERRIDES)
    backend.setup(0, 1, "cpu")
    backend.train_step(synthetic_batch())
    backend.save_checkpoint(tmp_path / "ckpt", training_state=False)
    ids = torch.tensor([[1, 5, 9, 30, 2, 7]])
    with torch.no_grad():
        ours = packed_logits(backend.model, ids, torch.arange(6)[None])
    backend.close()
    hf = AutoModelForCausalLM.from_pretrained(
        convert_checkpoint(tmp_path / "ckpt", tmp_path / "hf"), dtype=torch.float32
    )
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits[0], ours, atol=1e-5, rtol=0)


def pp2_worker(rank: int, world_size: int, model: str, out: str) -> None:
    """PP 2: each stage's weights reach rank 0 in the HF order; a trained checkpoint is saved and resumed."""
    from telescope.trainer.distributed import destroy_process_group, init_process_group

    init_process_group(rank, world_size, torch.device("cpu"))  # one group for both backends below
    settings = {"megatron_pipeline_parallel_size": 2, "trainer_num_workers": 2, **OVERRIDES}
    backend = make_backend(model, "megatron", **settings)
    backend.setup(rank, world_size, "cpu")
    weights = backend.named_weights()
    if rank == 0:
        torch.save(received(weights, Path(out) / "transport"), Path(out) / "received.pt")
    else:
        for _ in weights:  # the broadcasts from each stage are collective
            pass
    backend.train_step(synthetic_batch())
    backend.save_checkpoint(Path(out) / "ckpt", training_state=True)
    trained = [(n, t.clone()) for n, t in backend.named_weights()]
    backend.close()
    resumed = make_backend(model, "megatron", **settings)  # same layout: weights and optimizer state
    resumed.setup(rank, world_size, "cpu")
    meta = resumed.load_checkpoint(Path(out) / "ckpt")
    same = all(torch.equal(t, u) for (_, t), (_, u) in zip(trained, resumed.named_weights(), strict=True))
    resumed.close()
    if rank == 0:
        torch.save({"step": meta["step"], "same": same}, Path(out) / "resumed.pt")
    destroy_process_group()


@pytest.mark.slow
def test_pp2_sends_what_fsdp_sends_and_its_checkpoint_resumes_and_converts(tiny_model: Path, tmp_path: Path) -> None:
    from telescope_megatron.model import packed_logits
    from transformers import AutoModelForCausalLM

    from telescope.trainer.convert import convert_checkpoint

    spawn_ranks(pp2_worker, 2, str(tiny_model), str(tmp_path))
    assert_same_tensors(torch.load(tmp_path / "received.pt"), fsdp_received(tiny_model, tmp_path / "fsdp"))
    assert torch.load(tmp_path / "resumed.pt") == {"step": 1, "same": True}

    backend = make_backend(str(tiny_model), "megatron", **OVERRIDES)  # PP 1: weights resume, training state refused
    backend.setup(0, 1, "cpu")
    with pytest.raises(ValueError, match="megatron_pipeline_parallel_size 2"):
        backend.load_checkpoint(tmp_path / "ckpt")
    ids = torch.tensor([[1, 5, 9, 30, 2, 7]])
    with torch.no_grad():
        ours = packed_logits(backend.model, ids, torch.arange(6)[None])
    backend.close()
    hf = AutoModelForCausalLM.from_pretrained(
        convert_checkpoint(tmp_path / "ckpt", tmp_path / "hf"), dtype=torch.float32
    )
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits[0], ours, atol=1e-5, rtol=0)


def ep2_worker(rank: int, world_size: int, model: str, out: str) -> None:
    """EP 2 (two experts per rank): rank 0 receives the weights, then a trained checkpoint is saved and resumed."""
    from telescope.trainer.distributed import destroy_process_group, init_process_group

    init_process_group(rank, world_size, torch.device("cpu"))
    settings = {"megatron_expert_parallel_size": 2, "trainer_num_workers": 2, **OVERRIDES}
    backend = make_backend(model, "megatron", **settings)
    backend.setup(rank, world_size, "cpu")
    weights = backend.named_weights()
    if rank == 0:
        torch.save(received(weights, Path(out) / "transport"), Path(out) / "received.pt")
    else:
        for _ in weights:  # the expert gathers are collective
            pass
    backend.train_step(synthetic_batch())
    backend.save_checkpoint(Path(out) / "ckpt", training_state=True)
    trained = [(n, t.clone()) for n, t in backend.named_weights()]
    backend.close()
    resumed = make_backend(model, "megatron", **settings)  # same layout: weights and optimizer state
    resumed.setup(rank, world_size, "cpu")
    meta = resumed.load_checkpoint(Path(out) / "ckpt")
    same = all(torch.equal(t, u) for (_, t), (_, u) in zip(trained, resumed.named_weights(), strict=True))
    resumed.close()
    if rank == 0:
        torch.save({"step": meta["step"], "same": same}, Path(out) / "resumed.pt")
    destroy_process_group()


@pytest.mark.slow
def test_moe_ep2_sends_what_fsdp_sends_and_its_checkpoint_resumes_and_converts(moe_model: Path, tmp_path: Path) -> None:
    """The Qwen3-MoE weights (router, 3-D expert tensors) gathered over EP ranks: exactly FSDP's, in its order."""
    from telescope_megatron.model import packed_logits
    from transformers import AutoModelForCausalLM

    from telescope.trainer.convert import convert_checkpoint

    spawn_ranks(ep2_worker, 2, str(moe_model), str(tmp_path))
    got = torch.load(tmp_path / "received.pt")
    assert_same_tensors(got, fsdp_received(moe_model, tmp_path / "fsdp"))
    assert ("model.layers.0.mlp.experts.gate_up_proj", "torch.float32", (4, 96, 64)) in [g[:3] for g in got]
    assert torch.load(tmp_path / "resumed.pt") == {"step": 1, "same": True}

    backend = make_backend(str(moe_model), "megatron", **OVERRIDES)  # EP 1: weights resume, training state refused
    backend.setup(0, 1, "cpu")
    with pytest.raises(ValueError, match="megatron_expert_parallel_size 2"):
        backend.load_checkpoint(tmp_path / "ckpt")
    ids = torch.tensor([[1, 5, 9, 30, 2, 7]])
    with torch.no_grad():
        ours = packed_logits(backend.model, ids, torch.arange(6)[None])
    backend.close()
    hf = AutoModelForCausalLM.from_pretrained(
        convert_checkpoint(tmp_path / "ckpt", tmp_path / "hf"), dtype=torch.float32
    )
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids).logits[0], ours, atol=1e-5, rtol=0)
    untrained = AutoModelForCausalLM.from_pretrained(moe_model, dtype=torch.float32)
    with torch.no_grad():
        assert not torch.allclose(untrained(input_ids=ids).logits[0], ours), "the checkpoint holds no training"
