"""Sharded saving: the checkpoint's weights as a sharded Hugging Face folder, each file written by a rank that owns it.

Layout. With pipeline size ``P`` and tensor-parallel size ``T`` the weights go to
``P x T`` files, ``model-0000N-of-0000M.safetensors`` (one file: ``model.safetensors``),
named by ``model.safetensors.index.json``, so ``from_pretrained``, ``telescope
convert-checkpoint`` and this backend's loader (:mod:`telescope_megatron.sharded_load`,
at any parallel layout) read them. :func:`file_layout` decides, from the shapes alone,
which tensors each file holds: stage ``s``'s Hugging Face tensors (its layers, the
embedding on the first stage, the final norm and output layer on the last) are dealt
to the stage's ``T`` files, each tensor to the file with the fewest bytes so far, in
the Hugging Face order; so every rank computes the same layout and rank 0 the index.

Writing. The ranks of a stage walk its tensors together
(:meth:`MegatronBackend.stage_weights`): each is gathered over the tensor-parallel
group (a layer's experts over the expert-parallel group too) one at a time, and the
writer of the tensor's file appends it to that file
(:class:`~telescope.trainer.safetensors_folder.StreamWriter`, whose header is written
first from the known shapes). A file's writer is the tensor-parallel rank ``t`` of the
stage on the first data-parallel replica (data-parallel rank 0, context parallel
included); the other replicas take part in the gathers and write nothing. The stages
write at the same time, with no traffic between them.

Memory bound (per rank, on top of its own shards): one gathered tensor (this rank's
part cast to ``model_dtype``, the ``T`` gathered parts and their concatenation: ``2 + 1/T``
times the largest full tensor; a layer's stacked experts for MoE), or the Hugging Face
reordering's hold-back of at most one layer
(:func:`~telescope_megatron.convert.stream_hf_weights`) where that is more; never the
model. Measured: docs/megatron-backend.md. Writing ``T`` files per stage rather than one spreads the disk
writes over the ranks that gather anyway.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from telescope.trainer.public import safetensors_folder

if TYPE_CHECKING:
    from telescope_megatron.backend import MegatronBackend

#: One file of the layout: its name and its tensors (name, dtype, shape) in the order written.
File = tuple[str, list[safetensors_folder.Entry]]


def file_layout(
    hf_shapes: dict[str, torch.Size], owners: dict[str, int], pp_size: int, tp_size: int, dtype: torch.dtype
) -> list[File]:
    """The files of a checkpoint's weights, stage by stage (``pp_size x tp_size`` of them, see the module doc)."""
    count = pp_size * tp_size
    entries: list[list[safetensors_folder.Entry]] = [[] for _ in range(count)]
    sizes = [0] * count
    for name, shape in hf_shapes.items():  # the Hugging Face order
        stage = owners[name]
        target = min(range(stage * tp_size, (stage + 1) * tp_size), key=lambda i: sizes[i])
        entries[target].append((name, dtype, tuple(shape)))
        sizes[target] += safetensors_folder.entries_size([entries[target][-1]])
    return [(safetensors_folder.shard_file_name(i, count), entries[i]) for i in range(count)]


def write_hf_shards(backend: MegatronBackend, folder: Path) -> None:
    """Write the weights (``model_dtype``) into ``folder`` as a sharded Hugging Face folder. Collective.

    Every rank calls it; this rank writes at most one file (see the module doc); global
    rank 0 writes the index.
    """
    from megatron.core import parallel_state

    layout = file_layout(backend.hf_shapes, backend.hf_owners, backend.pp_size, backend.tp_size, backend.weights_dtype)
    replica = dist.get_rank(parallel_state.get_data_parallel_group(with_context_parallel=True))
    writer: safetensors_folder.StreamWriter | None = None
    mine: set[str] = set()
    if replica == 0:
        file, entries = layout[backend.pp_rank * backend.tp_size + backend.tp_rank]
        writer = safetensors_folder.StreamWriter(folder / file, entries)
        mine = {name for name, _, _ in entries}
    try:
        for name, tensor in backend.stage_weights():
            if writer is not None and name in mine:
                writer.write(name, tensor)
    except BaseException:
        if writer is not None:
            writer.close(check=False)
        raise
    if writer is not None:
        writer.close()
    if backend.global_rank == 0 and len(layout) > 1:
        weight_map = {name: file for file, entries in layout for name, _, _ in entries}
        total = safetensors_folder.entries_size(e for _, entries in layout for e in entries)
        safetensors_folder.write_index(folder, weight_map, total)
