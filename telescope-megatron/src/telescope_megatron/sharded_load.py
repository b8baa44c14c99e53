"""Sharded loading: each rank reads from the safetensors files only the slices of the weights it owns.

Design. A rank's parameters (:attr:`MegatronBackend.main`'s, named model-wide by
:func:`~telescope_megatron.pipeline.global_name` and
:func:`~telescope_megatron.moe.global_expert_name`) already say what it owns: the
layers of its pipeline stage (with the embedding on the first stage, the final norm
and the output layer on the last, the tied embedding's copy where the last stage
needs it), its experts (expert parallel), and its shard of each split weight
(tensor parallel, :data:`~telescope_megatron.convert.PARTITION_DIMS`). For each of them
:func:`local_tensor` asks the Hugging Face folder
(:class:`~telescope.trainer.safetensors_folder.FolderReader`, one ``model.safetensors``
or a sharded folder with its index) for exactly the rows or columns that make up
this rank's megatron tensor, and assembles them in megatron's layout:

- a weight split along dimension 0 or 1: that range of the Hugging Face tensor;
- ``linear_qkv`` (weight and bias): the q rows of this rank's key/value groups, then
  their k rows and v rows (three slices), interleaved per group as
  :func:`~telescope_megatron.convert.merge_qkv_groups` lays them out;
- a dense ``linear_fc1``: this rank's slice of ``gate_proj`` then of ``up_proj``;
- one expert's ``linear_fc1``/``linear_fc2``: its row of the layer's stacked
  ``gate_up_proj``/``down_proj``, and within it this rank's gate and up rows (or
  ``down`` columns);
- a replicated weight (the norms, the router): the whole tensor.

A folder with one tensor per expert (``mlp.experts.<e>.{gate,up,down}_proj.weight``,
the layout of the Qwen3-MoE checkpoints on the hub, which transformers stacks at load
time) is read the same way, expert by expert.

The result equals the full load followed by :func:`~telescope_megatron.convert.shard`
bit for bit (the same elements, cast to ``model_dtype`` then copied into the main
parameters as before); a test compares them at TP 2, PP 2 and EP 2 and counts the
elements each rank reads. Why slices rather than ``from_pretrained``: that builds
the whole model on every rank, a set-up peak of the model's size on each; slices keep
it to the rank's own shards plus the largest slice it reads (see docs/megatron-backend.md).
The files are memory-mapped by ``safe_open``; the pages a read touches count in the
rank's resident set while mapped, so the files are closed (unmapped) after each
parameter and those pages never add up beyond one parameter's.

Limits: ``get_slice`` reads each row's run of the file, so a column range (the
``linear_proj`` and ``linear_fc2`` shards, split along dimension 1) touches the pages
of every row of that tensor (page cache, reclaimable) while copying only this rank's
columns; a model named by a hub id is read from the local Hugging Face cache
(downloaded first, as ``from_pretrained`` would, when it is not there).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from telescope.trainer.public import safetensors_folder
from telescope_megatron.convert import expert_of, hf_source, merge_qkv_groups, partition_dim

if TYPE_CHECKING:
    from telescope_megatron.backend import MegatronBackend
    from telescope_megatron.model import ModelShape


def weights_folder(model_path: str) -> Path:
    """The local folder of ``model_path``'s weights (a hub id: its snapshot in the Hugging Face cache)."""
    if Path(model_path).is_dir():
        return Path(model_path)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model_path, allow_patterns=["*.safetensors", "*.json"]))


def _part(length: int, rank: int, size: int, name: str, dim: int) -> slice:
    if length % size:
        raise ValueError(f"{name}: dimension {dim} ({length}) is not divisible by the TP size {size}")
    step = length // size
    return slice(rank * step, (rank + 1) * step)


def _split(
    reader: safetensors_folder.FolderReader, hf: str, dim: int | None, rank: int, size: int, name: str
) -> torch.Tensor:
    """This rank's part of Hugging Face tensor ``hf`` along ``dim`` (None or one rank: all of it)."""
    if dim is None or size == 1:
        return reader.tensor(hf)
    part = _part(reader.shape(hf)[dim], rank, size, name, dim)
    return reader.slice(hf, (part,) if dim == 0 else (slice(None), part))


def local_tensor(
    reader: safetensors_folder.FolderReader, name: str, shape: ModelShape, rank: int, size: int
) -> torch.Tensor:
    """Tensor-parallel rank ``rank``'s part of megatron tensor ``name`` (one expert's: model-wide index), read
    from ``reader`` slice by slice; equal to ``shard(name, full, rank, size)`` of the full conversion."""
    expert = expert_of(name)
    if expert is not None:
        stacked, row = expert
        hf = hf_source(stacked)
        assert hf is not None
        if hf not in reader.files:  # a checkpoint with one tensor per expert (the Hugging Face hub's Qwen3-MoE)
            return _per_expert(reader, stacked, row, rank, size, name)
        dims = reader.shape(hf)  # gate_up_proj [E, 2 I, H], down_proj [E, H, I]
        if stacked.endswith("linear_fc1.weight"):
            half = dims[1] // 2
            rows = _part(half, rank, size, name, 0)
            gate = reader.slice(hf, (row, rows))
            up = reader.slice(hf, (row, slice(half + rows.start, half + rows.stop)))
            return torch.cat([gate, up], dim=0)
        return reader.slice(hf, (row, slice(None), _part(dims[2], rank, size, name, 1)))
    hf = hf_source(name)
    if hf is not None:
        return _split(reader, hf, partition_dim(name), rank, size, name)
    layer, _, suffix = name.removeprefix("decoder.layers.").partition(".")
    prefix = f"model.layers.{layer}."
    if suffix.startswith("self_attention.linear_qkv."):
        kind = suffix.rsplit(".", 1)[1]
        groups, d = shape.num_query_groups, shape.head_dim
        if groups % size:
            raise ValueError(f"{name}: {groups} key/value groups are not divisible by the TP size {size}")
        mine = groups // size
        q_rows = (shape.num_attention_heads // groups) * d
        first = rank * mine
        q = reader.slice(f"{prefix}self_attn.q_proj.{kind}", (slice(first * q_rows, (first + mine) * q_rows),))
        k = reader.slice(f"{prefix}self_attn.k_proj.{kind}", (slice(first * d, (first + mine) * d),))
        v = reader.slice(f"{prefix}self_attn.v_proj.{kind}", (slice(first * d, (first + mine) * d),))
        return merge_qkv_groups(q, k, v, mine, d)
    if suffix == "mlp.linear_fc1.weight":
        gate = _split(reader, prefix + "mlp.gate_proj.weight", 0, rank, size, name)
        up = _split(reader, prefix + "mlp.up_proj.weight", 0, rank, size, name)
        return torch.cat([gate, up], dim=0)
    raise KeyError(f"no Hugging Face weights for megatron parameter {name!r}")


def _per_expert(
    reader: safetensors_folder.FolderReader, stacked: str, row: int, rank: int, size: int, name: str
) -> torch.Tensor:
    """One expert's part from ``mlp.experts.<e>.{gate,up,down}_proj.weight`` (the unstacked layout)."""
    layer = stacked.removeprefix("decoder.layers.").partition(".")[0]
    prefix = f"model.layers.{layer}.mlp.experts.{row}."
    if stacked.endswith("linear_fc1.weight"):
        gate = _split(reader, prefix + "gate_proj.weight", 0, rank, size, name)
        return torch.cat([gate, _split(reader, prefix + "up_proj.weight", 0, rank, size, name)], dim=0)
    return _split(reader, prefix + "down_proj.weight", 1, rank, size, name)


@torch.no_grad()
def load_hf_weights(backend: MegatronBackend, folder: Path | str) -> int:
    """Read this rank's parts of the Hugging Face weights in ``folder`` into its main parameters, then the
    model's; returns the number of elements read (what the test of "only what it owns" checks)."""
    with safetensors_folder.FolderReader(folder) as reader:
        for name, param in backend.main.params.items():
            source = "embedding.word_embeddings.weight" if name == backend._tied_copy else name
            part = local_tensor(reader, source, backend.shape, backend.tp_rank, backend.tp_size)
            param.copy_(part.to(backend.weights_dtype))
            reader.close()  # unmap the files: their pages read so far would count in the resident set
        read = reader.elements_read
    backend.main.copy_to_model()
    return read
