"""Which checkpoints ``telescope eval`` evaluates, in step order, each with the folder its servers load.

Sources, from the config (:mod:`telescope.config.eval_form`) or the command line:

- ``checkpoint_dir``: every ``step_N`` folder in it (``N`` digits: Telescope writes
  ``step_00000050``, the upstream ``step_50``; both are read). A folder counts when it is
  a checkpoint of the kind ``hf_weights`` names; one that is not is skipped, with a note.
- ``checkpoints``: ``[{path, step}]``, each folder checked; given with ``checkpoint_dir``
  both are evaluated and the list wins on a step they share (the upstream's rule).
- the ``CHECKPOINT`` argument (``telescope eval CONFIG CHECKPOINT``): one checkpoint
  folder, a checkpoints root or a run directory (its latest), or a Hugging Face folder.
  It replaces ``checkpoint_dir`` (which, in a training config, is where that run saved);
  given with a ``checkpoints`` list it is an error (two answers to "what to evaluate").

``hf_weights`` (the upstream's key) says what the folders are:

- ``false`` (default): native checkpoints, ``step_N/`` with ``meta.json``, as the trainer
  writes them (:mod:`telescope.trainer.checkpoint`). The upstream converts its native
  checkpoints (sharded training state) to a Hugging Face folder before serving them;
  Telescope's native format already holds the weights in Hugging Face names
  (``model.safetensors``, or shards with ``model.safetensors.index.json`` as the megatron
  backend writes them) with ``config.json`` and the tokenizer, so the conversion is
  the identity and the folder is served as it is, no copy made. A folder without
  ``meta.json`` (e.g. one ``telescope convert-checkpoint`` wrote) is not native.
- ``true``: Hugging Face model folders, ``config.json`` and weights (``*.safetensors`` or
  ``pytorch_model.bin``): converted checkpoints, or any model folder. A native
  checkpoint is also one (it holds both), so it is accepted too.

Every failure is a :class:`CheckpointSourceError` whose message says what is wrong,
where, and how to fix it.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from telescope.schema.config import TelescopeConfig

STEP_FOLDER = re.compile(r"^step_(\d+)$")
META = "meta.json"  # telescope.trainer.checkpoint.META, without importing torch


class CheckpointSourceError(ValueError):
    """A checkpoint source that cannot be evaluated (missing, empty, of the wrong kind, ambiguous)."""


@dataclass(frozen=True)
class EvalCheckpoint:
    """One checkpoint to evaluate: its training step and the folder the servers load."""

    step: int
    path: Path


def is_native(folder: Path) -> bool:
    return (folder / META).is_file()


def is_hf_folder(folder: Path) -> bool:
    has_weights = any(folder.glob("*.safetensors")) or (folder / "pytorch_model.bin").is_file()
    return (folder / "config.json").is_file() and has_weights


def _kind(hf_weights: bool) -> str:
    return "Hugging Face model folder (config.json and weights)" if hf_weights else "native checkpoint (meta.json)"


def _is_kind(folder: Path, hf_weights: bool) -> bool:
    return is_hf_folder(folder) if hf_weights else is_native(folder)


def _other_kind_hint(folders: list[Path], hf_weights: bool) -> str:
    if not hf_weights and any(is_hf_folder(f) for f in folders):
        return "; they are Hugging Face model folders: set hf_weights: true"
    if hf_weights and any(is_native(f) and not is_hf_folder(f) for f in folders):
        return "; they are native checkpoints without weights: set hf_weights: false"
    return ""


def discover(root: Path, *, hf_weights: bool, notes: list[str] | None = None) -> list[EvalCheckpoint]:
    """The ``step_N`` checkpoints under ``root`` of the kind ``hf_weights`` names, oldest first.

    A ``step_N`` folder of another kind is skipped and a line saying so is added to ``notes``.
    Raises :class:`CheckpointSourceError` when ``root`` is not a folder or holds none.
    """
    where = f"checkpoint_dir {str(root)!r}"
    if not root.exists():
        raise CheckpointSourceError(
            f"{where} does not exist; set checkpoint_dir to the folder that holds the step_N checkpoints "
            "(a run's is RUN_DIR/checkpoints)"
        )
    if not root.is_dir():
        raise CheckpointSourceError(f"{where} is a file, not a folder of step_N checkpoints")
    step_folders: list[tuple[int, Path]] = []
    for child in root.iterdir():
        match = STEP_FOLDER.match(child.name)
        if match and child.is_dir():
            step_folders.append((int(match.group(1)), child))
    if not step_folders:
        raise CheckpointSourceError(
            f"{where} holds no step_N folder; point checkpoint_dir at the folder that holds them "
            "(e.g. RUN_DIR/checkpoints), or list the checkpoints: checkpoints: [{path: ..., step: N}]"
        )
    found: dict[int, Path] = {}
    for step, folder in sorted(step_folders):
        if not _is_kind(folder, hf_weights):
            if notes is not None:
                notes.append(f"skipping {folder}: not a {_kind(hf_weights)}")
            continue
        if step in found:
            raise CheckpointSourceError(
                f"{where}: {found[step].name} and {folder.name} are both step {step}; remove one"
            )
        found[step] = folder
    if not found:
        hint = _other_kind_hint([f for _, f in step_folders], hf_weights)
        raise CheckpointSourceError(
            f"{where}: none of its {len(step_folders)} step_N folders is a {_kind(hf_weights)}"
            f"{hint or '; they may be incomplete saves'}"
        )
    return [EvalCheckpoint(step, path) for step, path in sorted(found.items())]


def listed(config: TelescopeConfig) -> list[EvalCheckpoint]:
    """The ``checkpoints`` list, each folder checked to exist and to be of the ``hf_weights`` kind."""
    out: list[EvalCheckpoint] = []
    for i, entry in enumerate(config.checkpoints):
        folder = Path(entry.path)
        where = f"checkpoints[{i}] (step {entry.step})"
        if not folder.is_dir():
            what = "is a file, not a folder" if folder.exists() else "does not exist"
            raise CheckpointSourceError(f"{where}: {entry.path!r} {what}; fix its path or remove the entry")
        if not _is_kind(folder, config.hf_weights):
            hint = _other_kind_hint([folder], config.hf_weights)
            raise CheckpointSourceError(f"{where}: {entry.path!r} is not a {_kind(config.hf_weights)}{hint}")
        out.append(EvalCheckpoint(entry.step, folder.resolve()))
    return out


def _step_of(folder: Path) -> int:
    """A checkpoint folder's step: its ``meta.json``'s, else its ``step_N`` name's, else 0."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return int(json.loads((folder / META).read_text(encoding="utf-8"))["step"])
    match = STEP_FOLDER.match(folder.name)
    return int(match.group(1)) if match else 0


def from_argument(path: Path) -> EvalCheckpoint:
    """The ``CHECKPOINT`` argument: a checkpoint folder, a checkpoints root or run directory (its latest)
    or a Hugging Face model folder."""
    from telescope.trainer.checkpoint import resolve_checkpoint

    if not path.exists():
        raise CheckpointSourceError(f"no such checkpoint: {path}")
    for candidate in (path, path / "checkpoints"):
        with contextlib.suppress(FileNotFoundError):
            folder = resolve_checkpoint(candidate)
            return EvalCheckpoint(_step_of(folder), folder)
    if is_hf_folder(path):
        return EvalCheckpoint(_step_of(path), path)
    raise CheckpointSourceError(
        f"no checkpoint at {path}: expected a checkpoint folder (step_XXXXXXXX), a checkpoints folder or a run "
        "directory with checkpoints (checkpoint_every > 0), or a Hugging Face model folder"
    )


def resolve(
    config: TelescopeConfig, argument: Path | None = None, notes: list[str] | None = None
) -> list[EvalCheckpoint]:
    """Every checkpoint to evaluate, in step order (see the module docstring for the rules)."""
    if argument is not None:
        if config.checkpoints:
            raise CheckpointSourceError(
                f"both the CHECKPOINT argument ({argument}) and the checkpoints list say what to evaluate"
                "; drop the argument or the list (--checkpoints '[]')"
            )
        return [from_argument(argument)]
    if not config.checkpoint_dir and not config.checkpoints:
        raise CheckpointSourceError(
            "no checkpoint to evaluate: set checkpoint_dir (a folder of step_N checkpoints) or checkpoints "
            "([{path: ..., step: N}]), or pass one: telescope eval CONFIG CHECKPOINT"
        )
    by_step: dict[int, EvalCheckpoint] = {}
    if config.checkpoint_dir:
        for found in discover(Path(config.checkpoint_dir), hf_weights=config.hf_weights, notes=notes):
            by_step[found.step] = found
    for entry in listed(config):
        by_step[entry.step] = entry  # the explicit list wins on a shared step
    return [by_step[step] for step in sorted(by_step)]
