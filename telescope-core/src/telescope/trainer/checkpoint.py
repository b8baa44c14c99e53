"""Checkpoint layout, atomic writes, the ``latest`` pointer, retention and RNG state.

Layout of a checkpoint root (``checkpoint_dir``, default ``RUN_DIR/checkpoints``)::

    step_00000050/
        model.safetensors     full weights, Hugging Face names (tied weights once), or
                              model-0000N-of-0000M.safetensors + model.safetensors.index.json
                              (a backend that writes its weights sharded, e.g. megatron)
        config.json, tokenizer files   so the folder loads with from_pretrained
        optimizer.pt          full (unsharded) optimizer state   } only with
        scheduler.pt          LR scheduler state                 } training
        rng/rank_<r>.pt       RNG states of each rank            } state
        meta.json             step, world size, format; written last
    latest                    text file: the name of the newest complete checkpoint

Format choice: *full* state dicts gathered to rank 0, not DCP shards. They are
independent of the world size (resume on a different number of ranks works), and
the weights are already a Hugging Face checkpoint. The cost is that rank 0 holds a
full copy in CPU memory while saving, which is fine up to tens of billions of
parameters; larger models belong to the Megatron backend, which passes
``write_weights`` to :func:`write_checkpoint` instead and has every rank write its own
shards of a sharded Hugging Face folder. Readers accept both layouts
(:mod:`telescope.trainer.safetensors_folder`).

Atomicity: a checkpoint is written into ``.step_XXXXXXXX.tmp`` and renamed into
place only when complete, then ``latest`` is replaced with ``os.replace``. A crash
mid-save leaves a temporary folder (removed by the next successful save) and the
previous checkpoint and pointer intact. The folders must be on a filesystem every rank sees.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from telescope.trainer.distributed import barrier

if TYPE_CHECKING:
    from telescope.api.trainer import TrainerBackend
    from telescope.schema.config import TelescopeConfig

PREFIX = "step_"
LATEST = "latest"
META = "meta.json"
FORMAT = "telescope-full-state-v1"


def step_dir_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def checkpoint_root(config: TelescopeConfig) -> Path:
    """``checkpoint_dir``, else ``<run_dir>/checkpoints`` (``runs/<wandb_run_name>`` when unset)."""
    if config.checkpoint_dir:
        return Path(config.checkpoint_dir)
    run_dir = Path(config.run_dir) if config.run_dir else Path("runs") / config.wandb_run_name
    return run_dir / "checkpoints"


@contextmanager
def atomic_directory(final: Path, *, is_main: bool) -> Iterator[Path]:
    """Yield a temporary folder next to ``final``; rename it to ``final`` when the block succeeds.

    Collective: every rank enters with the same ``final``; rank 0 (``is_main``)
    creates, renames and replaces. An exception leaves ``final`` untouched.
    """
    tmp = final.parent / f".{final.name}.tmp"
    if is_main:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    barrier()
    yield tmp
    barrier()
    if is_main:
        old = final.parent / f".{final.name}.old"
        if final.exists():
            if old.exists():
                shutil.rmtree(old)
            final.rename(old)
        tmp.rename(final)
        if old.exists():
            shutil.rmtree(old)
    barrier()


def write_checkpoint(
    path: Path,
    *,
    rank: int,
    weights: dict[str, torch.Tensor] | None,
    save_config: Callable[[Path], None],
    main_files: dict[str, Any],
    rank_files: dict[str, Any],
    meta: dict[str, Any],
    write_weights: Callable[[Path], None] | None = None,
) -> None:
    """Write one checkpoint folder atomically, the same way for every backend (collective).

    Rank 0 writes ``weights`` as ``model.safetensors`` (or, with ``weights=None``, every
    rank calls ``write_weights(folder)`` to write its own part of the weights), calls ``save_config`` (config,
    tokenizer) and ``torch.save``s ``main_files`` (relative path -> object); then every
    rank saves its own ``rank_files`` (folders made by rank 0 from its own names, so
    every rank must name files in the same folders); rank 0 writes ``meta`` (with
    :data:`FORMAT`) last.
    """
    from safetensors.torch import save_file

    is_main = rank == 0
    with atomic_directory(Path(path), is_main=is_main) as tmp:
        if write_weights is not None:
            write_weights(tmp)
        if is_main and weights is not None:
            save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if is_main:
            save_config(tmp)
            for name, value in main_files.items():
                torch.save(value, tmp / name)
            for folder in {Path(name).parent for name in rank_files}:
                (tmp / folder).mkdir(parents=True, exist_ok=True)
        barrier()
        for name, value in rank_files.items():
            torch.save(value, tmp / name)
        barrier()
        if is_main:
            (tmp / META).write_text(json.dumps({"format": FORMAT, **meta}, indent=2), encoding="utf-8")


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def read_meta(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((path / META).read_text(encoding="utf-8"))
    return data


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as (step, folder), oldest first."""
    found: list[tuple[int, Path]] = []
    if not root.is_dir():
        return found
    for child in root.iterdir():
        if child.is_dir() and child.name.startswith(PREFIX) and (child / META).exists():
            try:
                found.append((int(child.name[len(PREFIX) :]), child))
            except ValueError:
                continue
    return sorted(found)


def latest_checkpoint(root: Path) -> Path | None:
    """The folder ``latest`` names, else the newest complete checkpoint, else None."""
    pointer = root / LATEST
    if pointer.exists():
        candidate = root / pointer.read_text(encoding="utf-8").strip()
        if (candidate / META).exists():
            return candidate
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint folder itself, or a root whose latest checkpoint is taken."""
    if (path / META).exists():
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise FileNotFoundError(f"no checkpoint in {path} (expected {META} or a '{LATEST}' pointer)")
    return latest


def checkpoints_to_delete(steps: list[int], keep_last: int | None, keep_every: int | None) -> list[int]:
    """Steps that retention removes: not among the ``keep_last`` newest nor a multiple of ``keep_every``."""
    if keep_last is None:
        return []
    recent = set(sorted(steps)[-keep_last:])
    return [s for s in steps if s not in recent and not (keep_every and s % keep_every == 0)]


def save_tokenizer(model_path: str, folder: Path) -> None:
    """The model's tokenizer beside its weights (nothing when the model has none)."""
    try:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(model_path).save_pretrained(folder)
    except (OSError, ValueError):  # a model without a tokenizer still checkpoints
        pass


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class TrainerCheckpoints:
    """When to save, where, the ``latest`` pointer and retention; the backend writes the contents.

    Call :meth:`save` / :meth:`maybe_save` on every rank (saving is collective).
    """

    def __init__(
        self,
        root: Path,
        *,
        every: int = 0,
        keep_last: int | None = None,
        keep_every: int | None = None,
        training_state: bool = True,
    ) -> None:
        self.root = Path(root)
        self.every = every
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.training_state = training_state

    @classmethod
    def from_config(cls, config: TelescopeConfig) -> TrainerCheckpoints:
        return cls(
            checkpoint_root(config),
            every=config.checkpoint_every,
            keep_last=config.checkpoint_keep_last,
            keep_every=config.checkpoint_keep_every,
            training_state=config.checkpoint_save_training_state,
        )

    def should_save(self, step: int) -> bool:
        return self.every > 0 and step > 0 and step % self.every == 0

    def maybe_save(self, backend: TrainerBackend, step: int) -> Path | None:
        return self.save(backend, step) if self.should_save(step) else None

    def save(self, backend: TrainerBackend, step: int) -> Path:
        """Write ``step_<step>`` through the backend, then move ``latest`` and apply retention."""
        import torch.distributed as dist

        path = self.root / step_dir_name(step)
        backend.save_checkpoint(path, training_state=self.training_state)
        if not dist.is_initialized() or dist.get_rank() == 0:
            write_text_atomic(self.root / LATEST, path.name + "\n")
            steps = [s for s, _ in list_checkpoints(self.root)]
            for doomed in checkpoints_to_delete(steps, self.keep_last, self.keep_every):
                shutil.rmtree(self.root / step_dir_name(doomed), ignore_errors=True)
            for leftover in self.root.glob(f".{PREFIX}*.tmp"):  # of saves that crashed (saves never overlap)
                shutil.rmtree(leftover, ignore_errors=True)
        barrier()
        return path

    def resume_path(self, resume_from_checkpoint: bool | int) -> Path | None:
        """The folder to resume from: ``true`` = latest, an int = that step, ``false`` = none."""
        if resume_from_checkpoint is False:
            return None
        if resume_from_checkpoint is True:
            return latest_checkpoint(self.root)
        path = self.root / step_dir_name(int(resume_from_checkpoint))
        if not (path / META).exists():
            raise FileNotFoundError(f"resume_from_checkpoint={resume_from_checkpoint}: no checkpoint at {path}")
        return path
