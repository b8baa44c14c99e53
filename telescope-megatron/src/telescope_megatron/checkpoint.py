"""The Megatron backend's checkpoints: Hugging Face weights written in shards, and each rank's optimizer shard.

A checkpoint holds the full weights in Hugging Face names, with the config and the
tokenizer, so ``telescope convert-checkpoint`` and ``from_pretrained`` read it: a
sharded folder (``model-0000N-of-0000M.safetensors`` and
``model.safetensors.index.json``; ``model.safetensors`` alone with one pipeline stage
and no tensor parallelism), each file written by a rank that holds its tensors
(:mod:`telescope_megatron.sharded_save`), through
:func:`telescope.trainer.checkpoint.write_checkpoint` (a temporary folder renamed into
place when complete, ``meta.json`` last); no rank gathers the model. The weights are
the main parameters (master weights) in ``model_dtype``. With the training state: the
scheduler, and per rank its optimizer shard (``optimizer/rank_N.pt``), RNG state and
precision state (``precision/rank_N.pt``: the float16 loss scale and its counters, and
this rank's main parameters where ``model_dtype`` cannot hold them exactly, e.g.
float32 main parameters of a bfloat16 ``model_dtype``; see
:mod:`telescope_megatron.precision`). A resume reads this rank's slices of the
Hugging Face weights into the main parameters (:mod:`telescope_megatron.sharded_load`,
either folder layout), then the saved main parameters over them, then rounds them into the
model's, so the main parameters and Adam's moments come back bit for bit. Weights load
at any parallel layout; the training state only at the layout it was saved with
(``world_size``, tensor-, pipeline- and expert-parallel sizes, and whether the
optimizer's states are sharded), which ``meta.json`` records, with the same dtypes.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from telescope.trainer.public import barrier
from telescope.trainer.public import checkpoint as ckpt
from telescope_megatron.optimizer import is_sharded, load_rank_state_dict, rank_state_dict
from telescope_megatron.sharded_load import load_hf_weights
from telescope_megatron.sharded_save import write_hf_shards

if TYPE_CHECKING:
    from telescope_megatron.backend import MegatronBackend


def save_megatron_checkpoint(backend: MegatronBackend, path: Path, *, training_state: bool = True) -> None:
    """Hugging Face weights + config (+ tokenizer), and per-rank optimizer shards. Collective."""
    main_files: dict[str, Any] = {}
    rank_files: dict[str, Any] = {}
    if training_state:
        main_files["scheduler.pt"] = backend.scheduler.state_dict()
        rank_files[f"optimizer/rank_{backend.global_rank}.pt"] = rank_state_dict(backend.optimizer)
        rank_files[f"rng/rank_{backend.global_rank}.pt"] = ckpt.rng_state()
        rank_files[f"precision/rank_{backend.global_rank}.pt"] = precision_state(backend)

    def save_config(folder: Path) -> None:
        backend.hf_config.save_pretrained(folder)
        ckpt.save_tokenizer(backend.model_path, folder)

    meta = {
        "backend": backend.name,
        "step": backend.step,
        "training_state": training_state,
        "world_size": backend.global_world_size,
        "megatron_tensor_parallel_size": backend.tp_size,
        "megatron_pipeline_parallel_size": backend.pp_size,
        "megatron_use_distributed_optimizer": is_sharded(backend.optimizer),
        "megatron_expert_parallel_size": backend.ep_size,
        "model": backend.context.model,
        "model_dtype": backend.context.model_dtype,
        "compute_dtype": str(backend.precision.compute).removeprefix("torch."),
        "megatron_main_params_dtype": str(backend.precision.main_params).removeprefix("torch."),
    }
    ckpt.write_checkpoint(
        path,
        rank=backend.global_rank,
        weights=None,
        write_weights=functools.partial(write_hf_shards, backend),
        save_config=save_config,
        main_files=main_files,
        rank_files=rank_files,
        meta=meta,
    )


def precision_state(backend: MegatronBackend) -> dict[str, Any]:
    """This rank's loss scale and, where the Hugging Face weights cannot hold them exactly, main parameters."""
    exact = backend.main.exact_in(backend.weights_dtype)
    return {
        "loss_scale": backend.loss_scaler.state_dict() if backend.loss_scaler is not None else None,
        "main_params": None if exact else backend.main.state_dict(),
    }


def load_precision_state(backend: MegatronBackend, state: dict[str, Any]) -> None:
    """Restore :func:`precision_state` (after the Hugging Face weights; the same layout)."""
    if state.get("main_params") is not None:
        backend.main.load_state_dict(state["main_params"])
    if state.get("loss_scale") is not None and backend.loss_scaler is not None:
        backend.loss_scaler.load_state_dict(state["loss_scale"])


def load_megatron_checkpoint(backend: MegatronBackend, path: Path) -> dict[str, Any]:
    """Restore weights (any layout), and optimizer/scheduler/RNG/step (same layout only). Collective."""
    folder = ckpt.resolve_checkpoint(Path(path))
    meta = ckpt.read_meta(folder)
    load_hf_weights(backend, folder)  # this rank's slices, at any layout
    shard_file = folder / "optimizer" / f"rank_{backend.global_rank}.pt"
    if meta.get("training_state") and shard_file.exists():
        layout = (
            meta.get("world_size"),
            meta.get("megatron_tensor_parallel_size"),
            meta.get("megatron_pipeline_parallel_size", 1),
            meta.get("megatron_expert_parallel_size", 1),
            meta.get("megatron_use_distributed_optimizer", False),
        )
        here = (
            backend.global_world_size,
            backend.tp_size,
            backend.pp_size,
            backend.ep_size,
            is_sharded(backend.optimizer),
        )
        if layout != here:
            raise ValueError(
                f"{folder}: its optimizer state was saved with world_size {layout[0]}, "
                f"megatron_tensor_parallel_size {layout[1]}, megatron_pipeline_parallel_size {layout[2]}, "
                f"megatron_expert_parallel_size {layout[3]} and its states sharded over data-parallel ranks: "
                f"{layout[4]}; this run has {', '.join(map(str, here[:4]))} and {here[4]}. Resume with the "
                "same layout and megatron_use_distributed_optimizer, or resume the weights only (a checkpoint "
                "saved with checkpoint_save_training_state: false)"
            )
        state = torch.load(shard_file, map_location=backend.device, weights_only=False)
        load_rank_state_dict(backend.optimizer, state)
        backend.scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=False))
        ckpt.set_rng_state(torch.load(folder / "rng" / f"rank_{backend.global_rank}.pt", weights_only=False))
        precision_file = folder / "precision" / f"rank_{backend.global_rank}.pt"
        if precision_file.exists():
            load_precision_state(backend, torch.load(precision_file, map_location=backend.device, weights_only=False))
    backend.step = int(meta["step"])
    barrier()
    return meta
