"""``telescope convert-checkpoint``: one checkpoint, or every (or some) step of a run's checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from telescope.cli.main import main

pytestmark = pytest.mark.slow  # trains a tiny model for three steps, converts up to three checkpoints


@pytest.fixture(scope="module")
def run_with_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, Any]]]:
    """A run directory whose ``checkpoints/`` the real trainer wrote at steps 1, 2 and 3, and each step's weights."""
    from telescope.plugins.facade import get_plugins
    from telescope.testing.trainer import synthetic_batch, tiny_model_for_session, tiny_trainer_config, weights_snapshot
    from telescope.trainer.checkpoint import TrainerCheckpoints

    model = tiny_model_for_session(tmp_path_factory)
    run_dir = tmp_path_factory.mktemp("run")
    config = tiny_trainer_config(model, number_of_steps=3)
    plugins = get_plugins()
    backend = plugins.create_trainer_backend(config, plugins.create_algorithm(config))
    backend.setup()
    weights: dict[int, dict[str, Any]] = {}
    try:
        manager = TrainerCheckpoints(run_dir / "checkpoints", every=1)
        for step in (1, 2, 3):
            backend.train_step(synthetic_batch(step=step, seed=step))
            manager.save(backend, step)
            weights[step] = weights_snapshot(backend)
    finally:
        backend.close()
    return run_dir, weights


def converted_weights(folder: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def assert_same_weights(folder: Path, expected: dict[str, Any]) -> None:
    import torch

    got = converted_weights(folder)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


def test_a_run_directory_converts_every_step_into_its_own_folder(
    capsys: pytest.CaptureFixture[str], run_with_checkpoints: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path
) -> None:
    run_dir, weights = run_with_checkpoints
    code = main(["convert-checkpoint", str(run_dir), str(tmp_path / "hf")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["step_00000001", "step_00000002", "step_00000003"]
    assert out.count("wrote ") == 3
    for step, expected in weights.items():
        assert_same_weights(tmp_path / "hf" / f"step_{step:08d}", expected)
    import torch

    assert any(not torch.equal(weights[1][k], weights[3][k]) for k in weights[1])


@pytest.mark.parametrize(("steps", "expected"), [("1,3", [1, 3]), ("2-9", [2, 3]), ("latest", [3])])
def test_steps_selects_among_a_checkpoint_root(
    capsys: pytest.CaptureFixture[str],
    run_with_checkpoints: tuple[Path, dict[int, dict[str, Any]]],
    tmp_path: Path,
    steps: str,
    expected: list[int],
) -> None:
    run_dir, weights = run_with_checkpoints
    code = main(["convert-checkpoint", str(run_dir / "checkpoints"), str(tmp_path / "hf"), "--steps", steps])
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [f"step_{s:08d}" for s in expected]
    assert_same_weights(tmp_path / "hf" / f"step_{expected[-1]:08d}", weights[expected[-1]])


def test_one_checkpoint_folder_converts_into_out_itself(
    capsys: pytest.CaptureFixture[str], run_with_checkpoints: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path
) -> None:
    run_dir, weights = run_with_checkpoints
    code = main(["convert-checkpoint", str(run_dir / "checkpoints" / "step_00000002"), str(tmp_path / "hf")])
    assert code == 0, capsys.readouterr().err
    assert_same_weights(tmp_path / "hf", weights[2])


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ("2,5", "--steps '2,5': no checkpoint for 5; the checkpoints are steps 1, 2, 3"),
        ("7-9", "--steps '7-9': no checkpoint for 7-9; the checkpoints are steps 1, 2, 3"),
        ("two", "--steps 'two': 'two' is not a step, a range A-B or 'latest'"),
    ],
)
def test_a_step_without_a_checkpoint_stops_before_anything_is_converted(
    capsys: pytest.CaptureFixture[str],
    run_with_checkpoints: tuple[Path, dict[int, dict[str, Any]]],
    tmp_path: Path,
    steps: str,
    message: str,
) -> None:
    run_dir, _ = run_with_checkpoints
    code = main(["convert-checkpoint", str(run_dir), str(tmp_path / "hf"), "--steps", steps])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err == f"error: {message}\n"
    assert not (tmp_path / "hf").exists()


def test_a_folder_without_checkpoints_and_steps_on_one_checkpoint_are_errors(
    capsys: pytest.CaptureFixture[str], run_with_checkpoints: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path
) -> None:
    code = main(["convert-checkpoint", str(tmp_path), str(tmp_path / "hf")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: no checkpoint in {tmp_path}: give a step_XXXXXXXX folder")
    one = run_with_checkpoints[0] / "checkpoints" / "step_00000001"
    code = main(["convert-checkpoint", str(one), str(tmp_path / "hf"), "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "is one checkpoint; --steps selects among" in err
