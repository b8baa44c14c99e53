"""``telescope eval`` in the upstream's form, end to end on the embedded engine (issue 16).

A tiny local model serves as every checkpoint: a native checkpoint is its Hugging Face
folder plus ``meta.json`` (the layout the trainer writes with
``checkpoint_save_training_state: false``), a converted one the folder alone. Each
checkpoint starts one embedded server. W&B runs offline and its run file is read back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from recording.test_wandb_logger import read_wandb_records  # tests/core is on sys.path (pytest prepend mode)

from telescope.cli.main import main
from telescope.recording.run_reader import RunReader

pytestmark = pytest.mark.requires_dist("telescope-envs")  # the countdown eval

COUNTDOWN = {
    "name": "countdown",
    "num_samples": 3,
    "kwargs": {
        "dataset_name": "generated",
        "num_samples": 50,
        "num_numbers": 2,
        "max_number": 9,
        "seed": 0,
        "prompt_style": "compact",
    },
}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from telescope.testing.trainer import tiny_model_for_session

    return tiny_model_for_session(tmp_path_factory)


def checkpoint(model: Path, folder: Path, step: int | None) -> Path:
    """A copy of ``model`` at ``folder``; native (with ``meta.json``) when ``step`` is given."""
    shutil.copytree(model, folder)
    if step is not None:
        meta = {"format": "telescope-full-state-v1", "step": step, "training_state": False, "world_size": 1}
        (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    return folder


def eval_file(tmp_path: Path, **values: Any) -> Path:
    data = {
        "inference_backend": "embedded",
        "inference_base_port": 8461,
        "max_model_len": 256,
        "max_tokens": 8,
        "max_concurrent_samples_per_server": 2,
        "evals": [COUNTDOWN],
        **values,
    }
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def run_eval(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["eval", *args])
    out, err = capsys.readouterr()
    return code, out, err


def history(output: Path) -> list[dict[str, Any]]:
    [run_file] = list((output / "wandb").glob("offline-run-*/run-*.wandb"))
    return [
        {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in r.history.item}
        for r in read_wandb_records(run_file)
        if r.WhichOneof("record_type") == "history"
    ]


def test_checkpoint_dir_is_evaluated_step_by_step_into_an_offline_wandb_run(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    for variable in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home" / variable.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    ckpts = tmp_path / "checkpoints"
    checkpoint(tiny_model, ckpts / "step_00000010", 10)
    checkpoint(tiny_model, ckpts / "step_2", 2)  # the upstream's naming
    checkpoint(tiny_model, ckpts / "step_00000005", None)  # not native: skipped with a note
    config = eval_file(tmp_path, checkpoint_dir=str(ckpts), wandb_run_path="local/telescope-test/evalrun1")
    output = tmp_path / "out"

    code, out, err = run_eval(capsys, str(config), "--output", str(output))
    assert code == 0, err
    assert f"note: skipping {ckpts / 'step_00000005'}: not a native checkpoint" in err
    assert "evaluating 2 checkpoint(s), step 2, 10" in err
    assert out.index("step 2:") < out.index("step 10:")
    records = RunReader(output).evals()
    assert [(r["name"], r["step"], Path(r["checkpoint"]).name, r["phase"]) for r in records] == [
        ("countdown", 2, "step_2", "standalone"),
        ("countdown", 10, "step_00000010", "standalone"),
    ]
    assert records[0]["metrics"]["eval/countdown/num_items"] == 3
    rows = history(output)
    assert [row["eval/countdown/step"] for row in rows] == [2, 10]
    assert [row["eval/countdown/correct_rate"] for row in rows] == [
        r["metrics"]["eval/countdown/correct_rate"] for r in records
    ]


def test_hf_weights_reads_converted_folders_and_only_them(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    converted = checkpoint(tiny_model, tmp_path / "converted" / "step_7", None)
    listed = [{"path": str(converted), "step": 7}]
    output = tmp_path / "out"
    code, _, err = run_eval(capsys, str(eval_file(tmp_path, checkpoints=listed)), "--output", str(output))
    assert code == 2 and "Traceback" not in err
    assert err.startswith("error: checkpoints[0] (step 7): ") and "set hf_weights: true" in err
    assert not output.exists()  # nothing started

    code, out, err = run_eval(
        capsys, str(eval_file(tmp_path, checkpoints=listed, hf_weights=True)), "--output", str(output)
    )
    assert code == 0, err
    assert "step 7:" in out and "wandb" not in {p.name for p in output.iterdir()}  # no wandb_run_path: no W&B
    assert [(r["step"], r["checkpoint"]) for r in RunReader(output).evals()] == [(7, str(converted))]
