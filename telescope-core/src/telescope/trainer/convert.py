"""A trainer checkpoint to a Hugging Face model folder (what ``telescope convert-checkpoint`` runs), streamed.

:func:`convert_checkpoint` takes a checkpoint folder (``step_XXXXXXXX``) or a checkpoint
root (its ``latest`` is used); :mod:`telescope.cli.commands_convert` picks the folders of
a run. The input weights may be one ``model.safetensors`` (the FSDP backend's) or a
sharded folder with ``model.safetensors.index.json`` (the megatron backend's). The
output folder receives the weights in the requested dtype (``model.safetensors``, or
``model-0000N-of-0000M.safetensors`` shards of at most ``max_shard_bytes`` with their
index, as ``save_pretrained`` lays them out), ``config.json`` (its ``dtype`` set),
``generation_config.json`` and the tokenizer, so ``AutoModelForCausalLM.from_pretrained(OUT)``
gives the trained model (a tied ``lm_head`` is left out and re-tied on load).

Streaming: the conversion never holds the model. The names are checked against the
architecture the checkpoint's config names, built on the meta device (no memory):
a missing or unknown weight fails, naming them, before anything is written. The
output shards are planned from the input headers (names, shapes); then each input
file is opened in turn and each tensor is read, cast and appended to the open output
shard (:class:`~telescope.trainer.safetensors_folder.StreamWriter`), so the peak
is one tensor and its cast, whatever the model's size. torch and transformers are
imported only when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    import torch

    from telescope.trainer.safetensors_folder import FolderReader

#: The default output shard size (``save_pretrained``'s default, 50 GB, is too large to move comfortably).
MAX_SHARD_BYTES = 5 * 2**30


def convert_checkpoint(
    checkpoint: Path, out: Path, dtype: str | None = None, *, max_shard_bytes: int = MAX_SHARD_BYTES
) -> Path:
    """Write ``checkpoint`` as a Hugging Face model folder at ``out``; returns ``out``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from telescope.trainer.checkpoint import read_meta, resolve_checkpoint
    from telescope.trainer.safetensors_folder import FolderReader

    folder = resolve_checkpoint(checkpoint)
    meta = read_meta(folder)
    config = AutoConfig.from_pretrained(folder)
    torch_dtype = getattr(torch, dtype or meta.get("model_dtype", "float32"))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    expected = list(model.state_dict())
    tied = (
        set(getattr(model, "_tied_weights_keys", None) or [])
        if getattr(config, "tie_word_embeddings", False)
        else set()
    )
    with FolderReader(folder) as reader:
        present = set(reader.names())
        missing = set(expected) - tied - present
        unknown = present - set(expected)
        if missing or unknown:
            raise click.ClickException(
                f"{folder}: the weights do not match {type(model).__name__}: missing {sorted(missing)[:5]}, "
                f"unknown {sorted(unknown)[:5]}"
            )
        out.mkdir(parents=True, exist_ok=True)
        _stream_weights(reader, out, torch_dtype, drop=tied, max_shard_bytes=max_shard_bytes)
    config.dtype = torch_dtype
    config.save_pretrained(out)
    try:
        generation = GenerationConfig.from_pretrained(folder)
    except OSError:
        generation = GenerationConfig.from_model_config(config)
    generation.save_pretrained(out)
    try:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(folder).save_pretrained(out)
    except (OSError, ValueError):
        click.echo(f"note: {folder} holds no tokenizer; copy one into {out}", err=True)
    return out


def _stream_weights(
    reader: FolderReader, out: Path, dtype: torch.dtype, *, drop: set[str], max_shard_bytes: int
) -> None:
    """Every tensor of ``reader`` but ``drop``, cast to ``dtype``, into output shards; one input file open at a time."""
    from telescope.trainer.safetensors_folder import (
        Entry,
        StreamWriter,
        entries_size,
        iter_files,
        plan_shards,
        shard_file_name,
        write_index,
    )

    order: list[tuple[str, str]] = []
    entries: list[Entry] = []
    for file, names in iter_files(reader):  # the headers, one file open at a time
        for name in names:
            if name not in drop:
                order.append((file, name))
                entries.append((name, dtype, reader.shape(name)))
        reader.close()
    shards = plan_shards(entries, max_shard_bytes)
    files = [shard_file_name(i, len(shards)) for i in range(len(shards))]
    file_of = {name: f for (f, name) in order}
    weight_map: dict[str, str] = {}
    current_input: str | None = None
    for shard, file in zip(shards, files, strict=True):
        writer = StreamWriter(out / file, shard)
        for name, _, _ in shard:
            if file_of[name] != current_input:  # inputs are visited in order, so each opens once
                reader.close()
                current_input = file_of[name]
            writer.write(name, reader.tensor(name).to(dtype))
            weight_map[name] = file
        writer.close()
    reader.close()
    if len(files) > 1:
        write_index(out, weight_map, entries_size(entries))
