"""Checkpoints: resume equivalence, atomic saves, retention, the latest pointer, convert-checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from telescope.plugins.facade import get_plugins
from telescope.testing.trainer import synthetic_batch, tiny_trainer_config, weights_snapshot
from telescope.trainer import checkpoint as ckpt
from telescope.trainer.checkpoint import TrainerCheckpoints, checkpoints_to_delete
from telescope.trainer.fsdp import FSDPBackend


def started(model: Path, **overrides: object) -> FSDPBackend:
    config = tiny_trainer_config(
        model, lr_scheduler="cosine", warmup_steps=1, number_of_steps=4, weight_decay=0.1, **overrides
    )
    backend = get_plugins().create_trainer_backend(config, get_plugins().create_algorithm(config))
    backend.setup()
    return backend


def test_resume_equals_straight_run(tiny_model: Path, tmp_path: Path) -> None:
    batches = [synthetic_batch(step=i, seed=i) for i in range(4)]
    straight = started(tiny_model)
    try:
        straight_lrs = [straight.train_step(b)["learning_rate"] for b in batches]
        expected = weights_snapshot(straight)
    finally:
        straight.close()

    first = started(tiny_model)
    manager = TrainerCheckpoints(tmp_path / "ckpts", every=2)
    try:
        lrs = [first.train_step(b)["learning_rate"] for b in batches[:2]]
        assert manager.maybe_save(first, first.step) is not None
    finally:
        first.close()
    resumed = started(tiny_model)
    try:
        path = manager.resume_path(True)
        assert path is not None and path.name == "step_00000002"
        assert resumed.load_checkpoint(path)["step"] == 2
        lrs += [resumed.train_step(b)["learning_rate"] for b in batches[2:]]
        got = weights_snapshot(resumed)
    finally:
        resumed.close()
    assert lrs == pytest.approx(straight_lrs)  # the LR scheduler state was restored
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-7)


def test_crash_during_save_keeps_last_good_checkpoint(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = started(tiny_model)
    manager = TrainerCheckpoints(tmp_path, every=1)
    try:
        backend.train_step(synthetic_batch())
        good = manager.save(backend, 1)
        good_weights = weights_snapshot(backend)
        backend.train_step(synthetic_batch(step=1, seed=1))

        real_save = torch.save

        def crash(obj: object, f: object, *args: object, **kwargs: object) -> None:
            if str(f).endswith("optimizer.pt"):
                raise OSError("disk full (simulated)")
            real_save(obj, f, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(torch, "save", crash)
        with pytest.raises(OSError, match="simulated"):
            manager.save(backend, 2)
        monkeypatch.setattr(torch, "save", real_save)

        assert not (tmp_path / "step_00000002").exists()
        assert ckpt.latest_checkpoint(tmp_path) == good
        assert (tmp_path / ckpt.LATEST).read_text().strip() == good.name
        backend.load_checkpoint(tmp_path)  # the root resolves to latest
        assert backend.step == 1
        after = weights_snapshot(backend)
        assert all(torch.equal(after[k], good_weights[k]) for k in after)

        manager.save(backend, 2)  # a later save succeeds and clears the leftover
        assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
        assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_00000002"
    finally:
        backend.close()


def test_retention_rule() -> None:
    steps = [1, 2, 3, 4, 5, 6, 7]
    # keep the 2 newest (6, 7) and every multiple of 3 (3, 6)
    assert checkpoints_to_delete(steps, keep_last=2, keep_every=3) == [1, 2, 4, 5]
    assert checkpoints_to_delete(steps, keep_last=None, keep_every=3) == []
    assert checkpoints_to_delete(steps, keep_last=3, keep_every=None) == [1, 2, 3, 4]


def test_manager_applies_retention_with_weights_only(tiny_model: Path, tmp_path: Path) -> None:
    backend = started(tiny_model)
    manager = TrainerCheckpoints(tmp_path, every=1, keep_last=1, keep_every=2, training_state=False)
    try:
        for step in (1, 2, 3):
            manager.save(backend, step)
    finally:
        backend.close()
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [2, 3]
    assert not (tmp_path / "step_00000003" / "optimizer.pt").exists()


def test_manager_from_config(tmp_path: Path) -> None:
    config = tiny_trainer_config("unused", checkpoint_dir=str(tmp_path), checkpoint_every=5, checkpoint_keep_last=2)
    manager = TrainerCheckpoints.from_config(config)
    assert manager.root == tmp_path and manager.keep_last == 2
    assert [manager.should_save(s) for s in (0, 4, 5, 10)] == [False, False, True, True]
    with pytest.raises(FileNotFoundError):
        manager.resume_path(7)


def test_convert_checkpoint_loads_with_identical_logits(tiny_model: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from telescope.cli.main import build_cli

    backend = started(tiny_model)
    try:
        backend.train_step(synthetic_batch())
        weights = weights_snapshot(backend)
        TrainerCheckpoints(tmp_path / "ckpts").save(backend, 1)
    finally:
        backend.close()
    result = CliRunner().invoke(build_cli(), ["convert-checkpoint", str(tmp_path / "ckpts"), str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "step_00000001", dtype=torch.float32)
    expected = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    expected.load_state_dict(weights, strict=False)
    ids = torch.tensor([[4, 8, 15, 16, 23, 42]])
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, expected(ids).logits)
    assert AutoTokenizer.from_pretrained(tmp_path / "hf" / "step_00000001").eos_token == "<|im_end|>"
