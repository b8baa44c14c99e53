"""Registers this package's sandbox providers through the public hook (lazily)."""

from __future__ import annotations

from telescope.hookspecs import hookimpl
from telescope.plugins.registry import Registrar

PROVIDERS: dict[str, str] = {
    "local": "telescope_sandbox.local:LocalProvider",
}


@hookimpl
def telescope_register_sandbox_providers(register: Registrar) -> None:
    for name, target in PROVIDERS.items():
        register(name, target)
