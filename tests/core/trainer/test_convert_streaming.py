"""``convert-checkpoint`` streams: a sharded checkpoint converts one input file and one tensor at a time."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, ClassVar

import click
import pytest
import torch
from safetensors.torch import save_file

from telescope.trainer.convert import convert_checkpoint
from telescope.trainer.safetensors_folder import INDEX, load_folder, shard_file_name, write_index


def sharded_checkpoint(model: Path, folder: Path, parts: int = 3, drop: str | None = None) -> dict[str, torch.Tensor]:
    """A native checkpoint folder of ``model``'s weights in ``parts`` files with an index (float32)."""
    from transformers import AutoModelForCausalLM

    folder.mkdir(parents=True)
    for name in model.iterdir():
        if not name.name.endswith(".safetensors") and name.is_file():
            shutil.copy(name, folder / name.name)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    weights = {
        n: t.detach().clone()
        for n, t in hf.state_dict().items()
        if n != "lm_head.weight" or not hf.config.tie_word_embeddings
    }
    names = [n for n in weights if n != drop]
    weight_map = {}
    for i in range(parts):
        file = shard_file_name(i, parts)
        chunk = names[i::parts]
        save_file({n: weights[n] for n in chunk}, str(folder / file))
        weight_map.update(dict.fromkeys(chunk, file))
    write_index(folder, weight_map, 0)
    (folder / "meta.json").write_text(json.dumps({"step": 1, "model_dtype": "float32"}))
    return weights


class CountingOpen:
    """``safetensors.safe_open`` that records how many files are open at once."""

    open_now = 0
    most = 0
    opened: ClassVar[list[str]] = []

    def __init__(self, path: str, framework: str, real: Any) -> None:
        self.handle = real(path, framework=framework)
        CountingOpen.opened.append(Path(path).name)

    def __enter__(self) -> CountingOpen:
        self.handle.__enter__()
        CountingOpen.open_now += 1
        CountingOpen.most = max(CountingOpen.most, CountingOpen.open_now)
        return self

    def __exit__(self, *exc: object) -> None:
        CountingOpen.open_now -= 1
        self.handle.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


def test_a_sharded_checkpoint_streams_into_bounded_shards(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import safetensors
    from transformers import AutoModelForCausalLM

    weights = sharded_checkpoint(tiny_model, tmp_path / "ckpt")
    real = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open", lambda path, framework: CountingOpen(path, framework, real))
    CountingOpen.most, CountingOpen.opened = 0, []
    limit = 64 * 1024
    out = convert_checkpoint(tmp_path / "ckpt", tmp_path / "hf", "bfloat16", max_shard_bytes=limit)

    assert CountingOpen.most == 1, "more than one input file open at once"
    inputs = [n for n in CountingOpen.opened if n.startswith("model-")]
    shards = [shard_file_name(i, 3) for i in range(3)]
    assert inputs == shards + shards, f"the headers, then the data, each input file once: {inputs}"
    index = json.loads((out / INDEX).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and sorted(p.name for p in out.glob("*.safetensors")) == files
    sizes = {n: t.numel() * 2 for n, t in weights.items()}
    for file in files:
        held = sum(sizes[n] for n, f in index["weight_map"].items() if f == file)
        assert held <= limit or len([f for f in index["weight_map"].values() if f == file]) == 1, file
    converted = AutoModelForCausalLM.from_pretrained(out)
    assert converted.dtype == torch.bfloat16
    state = converted.state_dict()
    for name, tensor in weights.items():
        assert torch.equal(state[name], tensor.to(torch.bfloat16)), name
    assert load_folder(out).keys() == weights.keys()


def test_a_missing_weight_still_fails_clearly(tiny_model: Path, tmp_path: Path) -> None:
    sharded_checkpoint(tiny_model, tmp_path / "ckpt", drop="model.norm.weight")
    with pytest.raises(click.ClickException, match=r"missing \['model.norm.weight'\]"):
        convert_checkpoint(tmp_path / "ckpt", tmp_path / "hf")
    assert not (tmp_path / "hf").exists(), "nothing written for a bad checkpoint"


def test_the_command_takes_the_largest_shard_size(tiny_model: Path, tmp_path: Path) -> None:
    from telescope.cli.main import main

    sharded_checkpoint(tiny_model, tmp_path / "ckpt", parts=1)
    assert main(["convert-checkpoint", str(tmp_path / "ckpt"), str(tmp_path / "one")]) == 0
    assert sorted(p.name for p in (tmp_path / "one").glob("*.safetensors")) == ["model.safetensors"]
    assert main(["convert-checkpoint", str(tmp_path / "ckpt"), str(tmp_path / "many"), "--max-shard-gb", "0.0001"]) == 0
    index = json.loads((tmp_path / "many" / INDEX).read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert load_folder(tmp_path / "many").keys() == load_folder(tmp_path / "one").keys()
