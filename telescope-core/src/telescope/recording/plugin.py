"""Registers the built-in loggers (``wandb``) through the public hook."""

from __future__ import annotations

from telescope.hookspecs import hookimpl
from telescope.plugins.registry import Registrar


@hookimpl
def telescope_register_loggers(register: Registrar) -> None:
    register("wandb", "telescope.recording.wandb_logger:WandbLogger")
