"""Registers this package's environments and evals through the public hooks (lazily)."""

from __future__ import annotations

from telescope.hookspecs import hookimpl
from telescope.plugins.registry import Registrar

ENVIRONMENTS: dict[str, str] = {
    "countdown": "telescope_envs.countdown:CountdownEnvironment",
}

EVALS: dict[str, str] = {}


@hookimpl
def telescope_register_environments(register: Registrar) -> None:
    for name, target in ENVIRONMENTS.items():
        register(name, target)


@hookimpl
def telescope_register_evals(register: Registrar) -> None:
    for name, target in EVALS.items():
        register(name, target)
