"""Which checkpoints ``telescope eval`` evaluates (issue 16): discovery, the explicit list, hf_weights, errors.

The folders here are made by hand with the files that mark each kind: a native
checkpoint has ``meta.json`` (and, as the trainer writes it, ``config.json`` and
``model.safetensors``); a Hugging Face folder has ``config.json`` and weights only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from telescope.config.loader import load_config
from telescope.runtime.eval_checkpoints import CheckpointSourceError, EvalCheckpoint, discover, resolve
from telescope.schema.config import TelescopeConfig


def native(folder: Path, step: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "meta.json").write_text(json.dumps({"format": "telescope-full-state-v1", "step": step}))
    return folder


def hf(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def eval_config(**values: Any) -> TelescopeConfig:
    data = {"evals": [{"name": "parity"}], **values}
    return load_config(None, data, check_plugins=False, purpose="eval").config


def steps(found: list[EvalCheckpoint]) -> list[int]:
    return [c.step for c in found]


def test_step_folders_are_found_in_step_order_whatever_their_padding(tmp_path: Path) -> None:
    for step in (100, 5, 20):
        native(tmp_path / f"step_{step:08d}", step)
    native(tmp_path / "step_7", 7)  # the upstream's naming
    (tmp_path / "latest").write_text("step_00000100\n")
    (tmp_path / ".step_00000200.tmp").mkdir()  # a save that crashed
    (tmp_path / "step_x").mkdir()
    found = resolve(eval_config(checkpoint_dir=str(tmp_path)))
    assert steps(found) == [5, 7, 20, 100]
    assert found[0].path == tmp_path / "step_00000005"


def test_a_folder_of_the_other_kind_is_skipped_with_a_note(tmp_path: Path) -> None:
    native(tmp_path / "step_1", 1)
    hf(tmp_path / "step_2")
    notes: list[str] = []
    assert steps(discover(tmp_path, hf_weights=False, notes=notes)) == [1]
    assert notes == [f"skipping {tmp_path / 'step_2'}: not a native checkpoint (meta.json)"]
    # a native checkpoint of ours is a Hugging Face folder too: hf_weights: true takes both
    assert steps(discover(tmp_path, hf_weights=True)) == [1, 2]


def test_hf_weights_says_which_folders_count(tmp_path: Path) -> None:
    for step in (3, 6):
        hf(tmp_path / f"step_{step}")
    assert steps(resolve(eval_config(checkpoint_dir=str(tmp_path), hf_weights=True))) == [3, 6]
    with pytest.raises(
        CheckpointSourceError, match=r"none of its 2 step_N folders is a native checkpoint.*set hf_weights: true"
    ):
        resolve(eval_config(checkpoint_dir=str(tmp_path)))


def test_native_checkpoints_without_weights_ask_for_hf_weights_false(tmp_path: Path) -> None:
    (tmp_path / "step_1").mkdir()
    (tmp_path / "step_1" / "meta.json").write_text("{}")
    with pytest.raises(CheckpointSourceError, match="set hf_weights: false"):
        discover(tmp_path, hf_weights=True)


def test_the_explicit_list_is_checked_and_wins_on_a_shared_step(tmp_path: Path) -> None:
    native(tmp_path / "ckpts" / "step_00000010", 10)
    native(tmp_path / "ckpts" / "step_00000020", 20)
    better = native(tmp_path / "elsewhere" / "ten", 10)
    extra = native(tmp_path / "elsewhere" / "fifteen", 15)
    config = eval_config(
        checkpoint_dir=str(tmp_path / "ckpts"),
        checkpoints=[{"path": str(extra), "step": 15}, {"path": str(better), "step": 10}],
    )
    found = resolve(config)
    assert [(c.step, c.path.name) for c in found] == [(10, "ten"), (15, "fifteen"), (20, "step_00000020")]
    only_list = resolve(eval_config(checkpoints=[{"path": str(extra), "step": 15}]))
    assert only_list == [EvalCheckpoint(15, extra)]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"checkpoint_dir": "{tmp}/missing"}, r"checkpoint_dir '.*missing' does not exist; set checkpoint_dir"),
        ({"checkpoint_dir": "{tmp}/empty"}, r"holds no step_N folder; point checkpoint_dir at"),
        ({"checkpoint_dir": "{tmp}/file"}, r"is a file, not a folder of step_N checkpoints"),
        ({"checkpoints": [{"path": "{tmp}/gone", "step": 3}]}, r"checkpoints\[0\] \(step 3\): '.*gone' does not exist"),
        ({"checkpoints": [{"path": "{tmp}/hf", "step": 3}]}, r"is not a native checkpoint.*set hf_weights: true"),
        ({}, r"no checkpoint to evaluate: set checkpoint_dir .* or checkpoints"),
    ],
)
def test_bad_sources_say_what_where_and_how_to_fix(tmp_path: Path, values: dict[str, Any], message: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("")
    hf(tmp_path / "hf")
    text = json.dumps(values).replace("{tmp}", str(tmp_path))
    config = load_config(
        None,
        {"evals": [{"name": "parity"}], **json.loads(text)},
        check_plugins=False,
        purpose="eval",
        checkpoint_argument=True,
    ).config
    with pytest.raises(CheckpointSourceError, match=message):
        resolve(config)


def test_two_folders_of_one_step_are_an_error(tmp_path: Path) -> None:
    native(tmp_path / "step_5", 5)
    native(tmp_path / "step_00000005", 5)
    with pytest.raises(CheckpointSourceError, match="are both step 5; remove one"):
        discover(tmp_path, hf_weights=False)


def test_the_argument_replaces_checkpoint_dir_but_not_a_list(tmp_path: Path) -> None:
    run = tmp_path / "run"
    native(run / "checkpoints" / "step_00000004", 4)
    native(run / "checkpoints" / "step_00000008", 8)
    (run / "checkpoints" / "latest").write_text("step_00000008\n")
    config = eval_config(checkpoint_dir=str(tmp_path / "not-used"))
    assert resolve(config, run) == [EvalCheckpoint(8, run / "checkpoints" / "step_00000008")]  # a run dir: latest
    assert steps(resolve(config, run / "checkpoints" / "step_00000004")) == [4]
    model = hf(tmp_path / "model")
    assert resolve(config, model) == [EvalCheckpoint(0, model)]  # a plain model folder has no step
    listed = eval_config(checkpoints=[{"path": str(model), "step": 1}], hf_weights=True)
    with pytest.raises(CheckpointSourceError, match=r"both the CHECKPOINT argument .* and the checkpoints list"):
        resolve(listed, model)
    with pytest.raises(CheckpointSourceError, match="no such checkpoint"):
        resolve(config, tmp_path / "nowhere")


def test_the_servers_of_a_checkpoint_are_sized_to_max_concurrent_samples_per_server(tmp_path: Path) -> None:
    from telescope.api.context import InferenceContext
    from telescope.inference.vllm_backend import max_num_seqs
    from telescope.runtime.standalone_eval import checkpoint_config

    folder = native(tmp_path / "step_3", 3)
    config = eval_config(checkpoint_dir=str(tmp_path), max_concurrent_samples_per_server=24, group_size=8)
    served = checkpoint_config(config, EvalCheckpoint(3, folder))
    assert served.model == str(folder) and config.model != str(folder)  # a copy; the config is unchanged
    context = InferenceContext.from_config(served)
    assert context.max_concurrent_sequences == 24 and max_num_seqs(context) == 24  # not 32 x 8
    pinned = checkpoint_config(eval_config(checkpoint_dir=str(tmp_path), max_num_seqs=5), EvalCheckpoint(3, folder))
    assert max_num_seqs(InferenceContext.from_config(pinned)) == 5  # an explicit max_num_seqs is kept
