"""Registers the built-in algorithms through the public hook, lazily (no torch import)."""

from __future__ import annotations

from telescope.algorithms import CAPABILITIES, TARGETS
from telescope.hookspecs import hookimpl
from telescope.plugins.registry import Registrar


@hookimpl
def telescope_register_algorithms(register: Registrar) -> None:
    for name, target in TARGETS.items():
        register(name, target, **CAPABILITIES[name].as_metadata())
