"""Registers this package's sandbox providers through the public hook (lazily)."""

from __future__ import annotations

from telescope.hookspecs import hookimpl
from telescope.plugins.registry import Registrar

PROVIDERS: dict[str, str] = {
    "local": "telescope_sandbox.local:LocalProvider",
    "e2b": "telescope_sandbox.remote.e2b:E2BProvider",
    "modal": "telescope_sandbox.remote.modal:ModalProvider",
    "daytona": "telescope_sandbox.remote.daytona:DaytonaProvider",
    "prime": "telescope_sandbox.remote.prime:PrimeProvider",
}


#: What to install for each remote provider's SDK (this package's extras): the hint a
#: user gets when the provider is chosen but its SDK is missing (also used by
#: :func:`telescope_sandbox.providers.missing_sdk`).
INSTALL_HINTS: dict[str, str] = {
    name: f"pip install 'telescope-sandbox[{name}]'" for name in ("e2b", "modal", "daytona", "prime")
}


@hookimpl
def telescope_register_sandbox_providers(register: Registrar) -> None:
    for name, target in PROVIDERS.items():
        hint = INSTALL_HINTS.get(name)
        register(name, target, **({"install_hint": hint} if hint else {}))
