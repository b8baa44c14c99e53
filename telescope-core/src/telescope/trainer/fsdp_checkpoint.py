"""The FSDP backend's checkpoint folder: writing it atomically and reading it back.

A folder (see :mod:`telescope.trainer.checkpoint` for the shared format: ``meta.json``,
atomic writes, ``latest``) holds the full weights in Hugging Face names
(``model.safetensors``, with the model config and the tokenizer, so it loads with
``from_pretrained``) and, with ``training_state``, the full optimizer state
(``optimizer.pt``, gathered to rank 0 and offloaded to the CPU), the scheduler
(``scheduler.pt``) and every rank's RNG state (``rng/rank_<r>.pt``). Loading
restores what is there; a rank with no RNG file of its own (a resume on more ranks)
takes rank 0's. Both are collectives: call them on every rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from telescope.trainer import checkpoint as ckpt
from telescope.trainer.distributed import barrier
from telescope.trainer.safetensors_folder import load_folder

if TYPE_CHECKING:
    from telescope.trainer.packed_backend import PackedTrainerBackend


def save_fsdp_checkpoint(backend: PackedTrainerBackend, path: Path, *, training_state: bool = True) -> None:
    """Write a checkpoint folder atomically (collective: call on every rank)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    weights = {name: t.to("cpu", copy=True).contiguous() for name, t in backend.named_weights()}
    main_files: dict[str, Any] = {}
    rank_files: dict[str, Any] = {}
    if training_state:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        main_files["optimizer.pt"] = get_optimizer_state_dict(backend.model, backend.optimizer, options=options)
        main_files["scheduler.pt"] = backend.scheduler.state_dict()
        rank_files[f"rng/rank_{backend.global_rank}.pt"] = ckpt.rng_state()

    def save_config(folder: Path) -> None:
        backend.model.config.save_pretrained(folder)
        ckpt.save_tokenizer(backend.model_path, folder)

    meta = {
        "step": backend.step,
        "training_state": training_state,
        "world_size": backend.global_world_size,
        "model": backend.context.model,
        "model_dtype": backend.context.model_dtype,
    }
    ckpt.write_checkpoint(
        path,
        rank=backend.global_rank,
        weights=weights,
        save_config=save_config,
        main_files=main_files,
        rank_files=rank_files,
        meta=meta,
    )


def load_fsdp_checkpoint(backend: PackedTrainerBackend, path: Path) -> dict[str, Any]:
    """Restore weights, and optimizer/scheduler/RNG/step when the checkpoint has them.

    ``path`` is a checkpoint folder or a root (its ``latest`` is used). Returns
    the checkpoint's ``meta.json``. Collective: call on every rank.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    folder = ckpt.resolve_checkpoint(Path(path))
    meta = ckpt.read_meta(folder)
    weights: dict[str, Any] = load_folder(folder)  # either layout: one file or an index
    options = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(backend.model, weights, options=options)
    if meta.get("training_state") and (folder / "optimizer.pt").exists():
        optim_state = torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=False)
        set_optimizer_state_dict(backend.model, backend.optimizer, optim_state, options=options)
        backend.scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=False))
        rng_file = folder / "rng" / f"rank_{backend.global_rank}.pt"
        if not rng_file.exists():
            rng_file = folder / "rng" / "rank_0.pt"
        ckpt.set_rng_state(torch.load(rng_file, weights_only=False))
    backend.step = int(meta["step"])
    barrier()
    return meta
