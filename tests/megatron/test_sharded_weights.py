"""Sharded loading and saving: a rank reads only its slices (equal to the full load + shard) and writes its files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.megatron.test_training import make_backend

from telescope.testing.trainer import spawn_ranks, synthetic_batch

OVERRIDES = {"megatron_gradient_checkpointing": False}


def full_megatron(folder: Path) -> tuple[dict[str, torch.Tensor], object]:
    """The full megatron tensors of ``folder`` as a full load makes them: ``from_pretrained``, then the conversion;
    a layer's stacked experts also under each expert's own name."""
    from telescope_megatron.convert import hf_to_megatron
    from telescope_megatron.model import ModelShape
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder)
    shape = ModelShape.from_hf(config)
    hf = dict(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict())
    full = hf_to_megatron(hf, shape)
    for name in [n for n in full if n.endswith(("experts.linear_fc1.weight", "experts.linear_fc2.weight"))]:
        prefix, _, leaf = name.rpartition(".linear_fc")
        for e, row in enumerate(full.pop(name)):
            full[f"{prefix}.local_experts.{e}.linear_fc{leaf}"] = row
    return full, shape


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "qwen3_moe_mixed"])
def test_each_tensor_parallel_rank_reads_exactly_its_shard(
    family: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from telescope_megatron.convert import shard
    from telescope_megatron.sharded_load import local_tensor
    from tests.megatron.conftest import build_family_model

    from telescope.trainer.safetensors_folder import FolderReader

    folder = build_family_model(tmp_path_factory.getbasetemp() / f"megatron-{family}", family)
    full, shape = full_megatron(folder)
    for size in (1, 2):
        for rank in range(size):
            with FolderReader(folder) as reader:
                for name, tensor in full.items():
                    before = reader.elements_read
                    got = local_tensor(reader, name, shape, rank, size)  # type: ignore[arg-type]
                    want = shard(name, tensor, rank, size)
                    assert got.dtype == want.dtype and torch.equal(got, want), (name, rank, size)
                    assert reader.elements_read - before == want.numel(), f"{name}: read more than its shard"


def load_worker(rank: int, world_size: int, model: str, out: str, settings: dict) -> None:
    """Set-up, with every safetensors read counted: each main parameter against a full load + shard."""
    from telescope_megatron.convert import shard

    from telescope.trainer import safetensors_folder

    read = [0]

    class Counting(safetensors_folder.FolderReader):
        def tensor(self, name: str) -> torch.Tensor:
            got = super().tensor(name)
            read[0] += got.numel()
            return got

        def slice(self, name: str, index: object) -> torch.Tensor:
            got = super().slice(name, index)
            read[0] += got.numel()
            return got

    safetensors_folder.FolderReader = Counting  # type: ignore[misc]  # this rank's process only
    backend = make_backend(model, "megatron", trainer_num_workers=world_size, **settings, **OVERRIDES)
    backend.setup(rank, world_size, "cpu")
    full, _ = full_megatron(Path(model))
    wrong = []
    for name, param in backend.main.params.items():
        source = "embedding.word_embeddings.weight" if name == backend._tied_copy else name
        if not torch.equal(param, shard(name, full[source], backend.tp_rank, backend.tp_size).to(param.dtype)):
            wrong.append(name)
    own = sum(p.numel() for p in backend.main.params.values())
    backend.close()
    torch.save({"wrong": wrong, "read": read[0], "own": own}, Path(out) / f"load_{rank}.pt")


LAYOUTS = {
    "tp2": ("tiny_model", {"megatron_tensor_parallel_size": 2}),
    "pp2": ("tiny_model", {"megatron_pipeline_parallel_size": 2}),
    "ep2": ("moe_model", {"megatron_expert_parallel_size": 2}),
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_setup_reads_only_the_ranks_part_and_equals_the_full_load(
    layout: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    fixture, settings = LAYOUTS[layout]
    model: Path = request.getfixturevalue(fixture)
    spawn_ranks(load_worker, 2, str(model), str(tmp_path), settings)
    from telescope.trainer.safetensors_folder import load_folder

    total = sum(t.numel() for t in load_folder(model).values())
    for rank in range(2):
        result = torch.load(tmp_path / f"load_{rank}.pt")
        assert result["wrong"] == [], f"rank {rank}: differs from the full load + shard"
        assert result["read"] == result["own"], f"rank {rank} read {result['read']}, owns {result['own']}"
        assert result["own"] < total, f"rank {rank} holds the whole model"


def save_worker(rank: int, world_size: int, model: str, out: str, settings: dict) -> None:
    """A trained checkpoint; which files this rank wrote; the full weights to compare the folder with."""
    from telescope_megatron import sharded_save

    written: list[str] = []
    real = sharded_save.safetensors_folder.StreamWriter

    class Recording(real):  # type: ignore[misc, valid-type]
        def __init__(self, path: Path, *args: object, **kwargs: object) -> None:
            written.append(Path(path).name)
            super().__init__(path, *args, **kwargs)

    sharded_save.safetensors_folder.StreamWriter = Recording  # this rank's process only
    backend = make_backend(model, "megatron", trainer_num_workers=world_size, **settings, **OVERRIDES)
    backend.setup(rank, world_size, "cpu")
    backend.train_step(synthetic_batch())
    backend.save_checkpoint(Path(out) / "ckpt", training_state=True)
    weights = {n: t.clone() for n, t in backend.named_weights()}
    coordinates = (backend.pp_rank, backend.tp_rank)
    backend.close()
    torch.save({"written": written, "coordinates": coordinates}, Path(out) / f"save_{rank}.pt")
    if rank == 0:
        torch.save(weights, Path(out) / "weights.pt")


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_each_rank_writes_its_own_files_of_a_sharded_hf_folder(
    layout: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from telescope.trainer.safetensors_folder import INDEX, load_folder

    fixture, settings = LAYOUTS[layout]
    spawn_ranks(save_worker, 2, str(request.getfixturevalue(fixture)), str(tmp_path), settings)
    folder = tmp_path / "ckpt"
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert sorted(p.name for p in folder.glob("*.safetensors")) == files
    index = json.loads((folder / INDEX).read_text())
    assert sorted(set(index["weight_map"].values())) == files
    for rank in range(2):
        saved = torch.load(tmp_path / f"save_{rank}.pt")
        stage, tp_rank = saved["coordinates"]
        assert saved["written"] == [files[stage * (2 if layout == "tp2" else 1) + tp_rank]], rank
    weights = torch.load(tmp_path / "weights.pt")
    on_disk = load_folder(folder)
    assert list(on_disk) != [] and set(on_disk) == set(weights)
    for name, tensor in weights.items():
        assert torch.equal(on_disk[name], tensor), name
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in weights.items()), "from_pretrained differs"
    if layout == "pp2":  # each stage's file holds its own layers only
        assert all(file == files[0] for n, file in index["weight_map"].items() if n.startswith("model.layers.0."))
        assert index["weight_map"]["model.norm.weight"] == files[1]


def test_file_layout_deals_each_stage_to_its_tensor_parallel_ranks_by_bytes() -> None:
    from telescope_megatron.sharded_save import file_layout

    shapes = {
        "model.embed_tokens.weight": torch.Size([8, 4]),
        "a": torch.Size([4]),
        "b": torch.Size([2]),
        "c": torch.Size([3]),
        "model.norm.weight": torch.Size([4]),
    }
    owners = {"model.embed_tokens.weight": 0, "a": 0, "b": 0, "c": 1, "model.norm.weight": 1}
    layout = file_layout(shapes, owners, 2, 2, torch.bfloat16)
    names = [(file, [n for n, _, _ in entries]) for file, entries in layout]
    assert names == [
        ("model-00001-of-00004.safetensors", ["model.embed_tokens.weight"]),
        ("model-00002-of-00004.safetensors", ["a", "b"]),
        ("model-00003-of-00004.safetensors", ["c"]),
        ("model-00004-of-00004.safetensors", ["model.norm.weight"]),
    ]
    assert file_layout(shapes, dict.fromkeys(shapes, 0), 1, 1, torch.bfloat16)[0][0] == "model.safetensors"
