"""Which W&B run a run logs to: project, name, tags and run id, from the config, the environment and the run directory.

The rule, field by field (what a W&B user's ``WANDB_*`` variables do here):

- ``wandb_project`` / ``WANDB_PROJECT``, ``wandb_run_name`` / ``WANDB_NAME``, ``wandb_tags`` /
  ``WANDB_TAGS`` (comma-separated): a value the config sets (in its file or on the command
  line) wins; a field the config leaves at its default takes the variable when it is set,
  else the default. ``wandb_run_name`` names the run directory whatever W&B's name is.
- ``WANDB_ENTITY``, ``WANDB_RUN_GROUP``, ``WANDB_JOB_TYPE`` (no config field): passed
  through; ``wandb`` reads them itself. ``WANDB_MODE``: see
  :func:`telescope.recording.wandb_logger.wandb_mode`.
- Run id: ``WANDB_RUN_ID`` when set, else the id this run directory recorded when its
  W&B run started (``wandb_run.json``; a resumed run continues in the same directory),
  else a new one. With an id, ``resume`` is ``WANDB_RESUME`` when set, else ``allow``
  (continue the W&B run of that id, or start one with it), so a resumed run continues
  the same W&B run.

Limits: W&B drops a ``log`` whose step is lower than one it already has, so after a
resume from a checkpoint the re-trained steps up to the last one logged before the stop
keep their first values in W&B (the run store keeps both, see
:mod:`telescope.recording.run_attempts`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telescope.recording.jsonl import write_atomic

#: The file of the run directory that records the W&B run it logs to.
RUN_ID_FILE = "wandb_run.json"


@dataclass(frozen=True)
class WandbIdentity:
    """The ``wandb.init`` arguments that say which run: see the module docstring for the rule."""

    project: str
    name: str
    tags: tuple[str, ...]
    run_id: str | None
    resume: str | None

    def init_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"project": self.project, "name": self.name, "tags": list(self.tags)}
        if self.run_id is not None:
            kwargs.update(id=self.run_id, resume=self.resume)
        return kwargs


def resolve_identity(
    *,
    project: str,
    name: str,
    tags: Collection[str],
    explicit: Collection[str],
    run_dir: Path,
    environ: Mapping[str, str] | None = None,
) -> WandbIdentity:
    """The identity for the config values ``project``, ``name``, ``tags`` (``explicit``: the
    config fields the config set, the others hold defaults), the environment and ``run_dir``."""
    env = os.environ if environ is None else environ

    def pick(field: str, value: str, variable: str) -> str:
        return value if field in explicit else (env.get(variable, "").strip() or value)

    env_tags = [tag.strip() for tag in env.get("WANDB_TAGS", "").split(",") if tag.strip()]
    run_id = env.get("WANDB_RUN_ID", "").strip() or recorded_run_id(run_dir)
    return WandbIdentity(
        project=pick("wandb_project", project, "WANDB_PROJECT"),
        name=pick("wandb_run_name", name, "WANDB_NAME"),
        tags=tuple(tags if "wandb_tags" in explicit or not env_tags else env_tags),
        run_id=run_id,
        resume=(env.get("WANDB_RESUME", "").strip() or "allow") if run_id else None,
    )


def recorded_run_id(run_dir: Path) -> str | None:
    """The W&B run id ``run_dir`` recorded (``None``: none, or an unreadable file)."""
    try:
        data = json.loads((run_dir / RUN_ID_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    run_id = data.get("id") if isinstance(data, dict) else None
    return run_id if isinstance(run_id, str) and run_id else None


def record_run(run_dir: Path, run: Any) -> None:
    """Record the started W&B ``run`` (id, project, entity, name) in ``run_dir`` for a resume."""
    fields = {"id": run.id, "project": run.project, "entity": run.entity, "name": run.name}
    write_atomic(run_dir / RUN_ID_FILE, json.dumps(fields, indent=2) + "\n")
