"""Registers the built-in trainer backend (``fsdp``) through the public hook."""

from __future__ import annotations

from telescope.hookspecs import hookimpl
from telescope.plugins.registry import Registrar


@hookimpl
def telescope_register_trainer_backends(register: Registrar) -> None:
    register("fsdp", "telescope.trainer.fsdp:FSDPBackend")
