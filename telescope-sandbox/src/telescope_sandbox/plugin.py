"""Registers this package's sandbox and browser providers through the public hooks (lazily)."""

from __future__ import annotations

from telescope.plugins.hookspecs import hookimpl
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


#: The SDK module each remote provider imports when it is used: registered as ``requires``
#: metadata, so that ``telescope config validate`` reports a chosen provider whose SDK is
#: missing (with its install hint) without importing anything.
SDK_MODULES: dict[str, str] = {"e2b": "e2b", "modal": "modal", "daytona": "daytona", "prime": "prime_sandboxes"}


@hookimpl
def telescope_register_sandbox_providers(register: Registrar) -> None:
    for name, target in PROVIDERS.items():
        metadata: dict[str, object] = {}
        if name in INSTALL_HINTS:
            metadata["install_hint"] = INSTALL_HINTS[name]
        if name in SDK_MODULES:
            metadata["requires"] = (SDK_MODULES[name],)
        register(name, target, **metadata)


#: The browser providers: ``local`` drives an installed Chromium with Playwright (the ``browser`` extra).
BROWSER_PROVIDERS: dict[str, str] = {"local": "telescope_sandbox.browser:LocalBrowserProvider"}


@hookimpl
def telescope_register_browser_providers(register: Registrar) -> None:
    register(
        "local",
        BROWSER_PROVIDERS["local"],
        requires=("playwright",),
        install_hint="pip install 'telescope-sandbox[browser]' (and apt-get install chromium)",
    )
