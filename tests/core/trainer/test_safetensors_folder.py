"""Weights folders: the streamed writer's files equal safetensors' own, and readers take either layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from telescope.trainer.safetensors_folder import (
    INDEX,
    FolderReader,
    StreamWriter,
    load_folder,
    plan_shards,
    shard_file_name,
    write_file,
    write_index,
)

TENSORS = {
    "a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
    "b": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
    "c": torch.tensor(7, dtype=torch.int64),
    "d": torch.zeros(0, 5, dtype=torch.float16),
}


def entries(tensors: dict[str, torch.Tensor]) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    return [(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()]


def test_a_streamed_file_reads_back_as_safetensors_writes_it(tmp_path: Path) -> None:
    write_file(tmp_path / "streamed.safetensors", entries(TENSORS), TENSORS.items())
    save_file(TENSORS, str(tmp_path / "reference.safetensors"), metadata={"format": "pt"})
    streamed, reference = (
        load_file(str(tmp_path / "streamed.safetensors")),
        load_file(str(tmp_path / "reference.safetensors")),
    )
    assert sorted(streamed) == sorted(reference)
    for name, tensor in reference.items():
        assert streamed[name].dtype == tensor.dtype and torch.equal(streamed[name], tensor), name


def test_the_writer_refuses_a_tensor_out_of_order_and_a_missing_one(tmp_path: Path) -> None:
    writer = StreamWriter(tmp_path / "x.safetensors", entries(TENSORS))
    with pytest.raises(ValueError, match="expected"):
        writer.write("b", TENSORS["b"])
    writer.write("a", TENSORS["a"])
    with pytest.raises(ValueError, match="3 announced tensors were not written"):
        writer.close()


def sharded_folder(folder: Path) -> None:
    folder.mkdir()
    parts = [["a", "b"], ["c", "d"]]
    weight_map = {}
    for i, names in enumerate(parts):
        file = shard_file_name(i, len(parts))
        save_file({n: TENSORS[n] for n in names}, str(folder / file))
        weight_map.update(dict.fromkeys(names, file))
    write_index(folder, weight_map, 0)


def test_a_reader_takes_a_sharded_folder_and_counts_what_it_reads(tmp_path: Path) -> None:
    sharded_folder(tmp_path / "sharded")
    assert (tmp_path / "sharded" / INDEX).is_file()
    assert set(load_folder(tmp_path / "sharded")) == set(TENSORS)
    with FolderReader(tmp_path / "sharded") as reader:
        assert torch.equal(reader.slice("a", (slice(1, 2), slice(None))), TENSORS["a"][1:2])
        assert torch.equal(reader.slice("a", (slice(None), slice(2, 4))), TENSORS["a"][:, 2:4])
        assert reader.elements_read == 4 + 6
        assert torch.equal(reader.tensor("c"), TENSORS["c"])
        assert reader.shape("b") == (2, 3)
        assert [r[0] for r in reader.requests] == ["a", "a", "c"]
    single = tmp_path / "single"
    single.mkdir()
    save_file(TENSORS, str(single / "model.safetensors"))
    assert set(load_folder(single)) == set(TENSORS)


def test_shards_are_planned_under_the_size_a_larger_tensor_alone() -> None:
    plan = plan_shards([("a", torch.float32, (4,)), ("b", torch.float32, (2,)), ("c", torch.float32, (9,))], 24)
    assert [[n for n, _, _ in shard] for shard in plan] == [["a", "b"], ["c"]]
    assert shard_file_name(0, 1) == "model.safetensors" and shard_file_name(1, 3) == "model-00002-of-00003.safetensors"


def test_the_fsdp_backend_loads_weights_from_a_sharded_checkpoint(tiny_model: Path, tmp_path: Path) -> None:
    """A checkpoint whose weights are sharded with an index (as the megatron backend writes them) loads."""
    from telescope.plugins.facade import get_plugins
    from telescope.testing.trainer import synthetic_batch, tiny_trainer_config, weights_snapshot

    config = tiny_trainer_config(tiny_model)
    plugins = get_plugins()
    backend = plugins.create_trainer_backend(config, plugins.create_algorithm(config))
    backend.setup()
    try:
        backend.train_step(synthetic_batch())
        backend.save_checkpoint(tmp_path / "ckpt", training_state=False)
        trained = weights_snapshot(backend)
    finally:
        backend.close()
    single = tmp_path / "ckpt" / "model.safetensors"
    tensors = load_file(str(single))
    single.unlink()
    names = list(tensors)
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        save_file({n: tensors[n] for n in part}, str(tmp_path / "ckpt" / shard_file_name(i, 2)))
        weight_map.update(dict.fromkeys(part, shard_file_name(i, 2)))
    write_index(tmp_path / "ckpt", weight_map, 0)
    fresh = plugins.create_trainer_backend(config, plugins.create_algorithm(config))
    fresh.setup()
    try:
        fresh.load_checkpoint(tmp_path / "ckpt")
        loaded = weights_snapshot(fresh)
    finally:
        fresh.close()
    for name, tensor in trained.items():
        assert torch.equal(loaded[name], tensor), name
