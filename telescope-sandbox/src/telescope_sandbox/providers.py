"""Choosing a provider by name: the registry lookup, with install hints.

``get_provider("local")`` returns an :class:`~telescope_sandbox.observed.ObservedProvider`
around the registered provider class, instantiated with the given keyword arguments.
Providers are registered lazily (``"module:Class"``) in :mod:`telescope_sandbox.plugin`
or by any third-party package; a provider whose SDK is missing raises
:class:`~telescope.api.sandbox.SandboxError` naming the ``pip install`` that adds it.
"""

from __future__ import annotations

from typing import Any

from telescope.api.sandbox import SandboxError, SandboxProvider
from telescope_sandbox.observed import ObservedProvider

#: The extra (or package) that provides each remote provider's SDK.
INSTALL_HINTS: dict[str, str] = {
    "e2b": "pip install 'telescope-sandbox[e2b]'",
    "modal": "pip install 'telescope-sandbox[modal]'",
    "daytona": "pip install 'telescope-sandbox[daytona]'",
    "prime": "pip install 'telescope-sandbox[prime]'",
}


def missing_sdk(provider: str, module: str, exc: ImportError) -> SandboxError:
    """The error a provider raises when its SDK is not installed."""
    hint = INSTALL_HINTS.get(provider, f"pip install {module}")
    return SandboxError(
        f"sandbox provider {provider!r} needs the {module!r} package, which is not installed ({exc}). "
        f"Install it with: {hint}"
    )


def provider_class(name: str) -> type[SandboxProvider]:
    """The provider class registered under ``name`` (raises a clear error when unknown)."""
    from telescope.plugins.manager import get_plugin_manager
    from telescope.plugins.registry import PluginError, PluginKind

    try:
        cls = get_plugin_manager().registry.get(PluginKind.SANDBOX_PROVIDER, name)
    except PluginError as exc:
        hint = INSTALL_HINTS.get(name)
        raise SandboxError(f"{exc}" + (f" Install it with: {hint}" if hint and hint not in str(exc) else "")) from exc
    if not (isinstance(cls, type) and issubclass(cls, SandboxProvider)):
        raise SandboxError(f"sandbox provider {name!r} is registered as {cls!r}, which is not a SandboxProvider")
    return cls


def get_provider(name: str = "local", **kwargs: Any) -> ObservedProvider:
    """Instantiate the provider registered under ``name``, wrapped so that it emits events."""
    return ObservedProvider(provider_class(name)(**kwargs), name)
