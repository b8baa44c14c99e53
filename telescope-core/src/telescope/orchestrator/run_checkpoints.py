"""Whole-run checkpoints: the trainer's checkpoint plus the orchestrator's state.

The trainer side (weights, optimizer, LR schedule, RNG; atomic folder, ``latest``
pointer, retention) is :class:`telescope.trainer.checkpoint.TrainerCheckpoints`, run
on every trainer rank. The orchestrator's state (step, prompt position, counters)
is a sidecar ``step_XXXXXXXX.orchestrator.json`` next to the step's folder, written
*before* the trainer commits its folder: a crash between the two leaves an orphan
sidecar (ignored, removed later) and never a trainer checkpoint without its
orchestrator state, so a resume never restarts the prompt stream from zero.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from telescope.orchestrator.services import TrainingService
from telescope.schema.config import TelescopeConfig

SIDECAR_SUFFIX = ".orchestrator.json"


class RunCheckpointError(RuntimeError):
    """A checkpoint cannot be resumed from; the message says why and what to do."""


class RunCheckpoints:
    """When to save and how to find what to resume from."""

    def __init__(self, config: TelescopeConfig) -> None:
        from telescope.trainer import checkpoint as trainer_ckpt

        self._ckpt = trainer_ckpt
        #: ``resume_from_checkpoint``: False, True (the latest) or a step
        self.resume_from: bool | int = config.resume_from_checkpoint
        self.trainer = trainer_ckpt.TrainerCheckpoints.from_config(config)
        self.root = self.trainer.root

    @property
    def enabled(self) -> bool:
        return self.trainer.every > 0

    def due(self, step: int) -> bool:
        return self.trainer.should_save(step)

    def folder(self, step: int) -> Path:
        return self.root / self._ckpt.step_dir_name(step)

    def exists(self, step: int) -> bool:
        return (self.folder(step) / self._ckpt.META).exists()

    def sidecar(self, folder: Path) -> Path:
        return folder.with_name(folder.name + SIDECAR_SUFFIX)

    async def save(self, step: int, training: TrainingService, state: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._ckpt.write_text_atomic(self.sidecar(self.folder(step)), json.dumps(state, indent=2))
        await training.save_checkpoint(step)
        self._remove_orphans()

    def _remove_orphans(self) -> None:
        for sidecar in self.root.glob(f"*{SIDECAR_SUFFIX}"):
            folder = sidecar.with_name(sidecar.name[: -len(SIDECAR_SUFFIX)])
            if not folder.exists():
                sidecar.unlink(missing_ok=True)

    def resume_path(self) -> Path | None:
        """The checkpoint folder ``resume_from_checkpoint`` names, or None when not resuming."""
        try:
            folder = self.trainer.resume_path(self.resume_from)
        except FileNotFoundError as exc:
            raise RunCheckpointError(f"{exc}. Available: {self.available() or 'none'}") from None
        if folder is None:
            if self.resume_from is True:
                raise RunCheckpointError(
                    f"resume_from_checkpoint=true but there is no checkpoint under {self.root}; "
                    "set checkpoint_dir to the run's checkpoint folder or resume_from_checkpoint: false"
                )
            return None
        if not self.sidecar(folder).exists():
            raise RunCheckpointError(
                f"{folder} has no orchestrator state ({self.sidecar(folder).name}); it was not written by "
                "`telescope run`. Load it as a model instead (model: <folder>)."
            )
        return folder

    def latest(self) -> Path | None:
        """The newest complete checkpoint of this run with its orchestrator state, or None."""
        folder = self._ckpt.latest_checkpoint(self.root) if self.enabled else None
        if folder is None or not self.sidecar(folder).exists():
            return None
        return folder

    def read_state(self, folder: Path) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.sidecar(folder).read_text(encoding="utf-8"))
        return data

    def available(self) -> str:
        return ", ".join(str(step) for step, _ in self._ckpt.list_checkpoints(self.root))
