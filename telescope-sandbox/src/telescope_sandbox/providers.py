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
from telescope_sandbox.plugin import INSTALL_HINTS


def missing_sdk(provider: str, module: str, exc: ImportError) -> SandboxError:
    """The error a provider raises when its SDK is not installed."""
    hint = INSTALL_HINTS.get(provider, f"pip install {module}")
    return SandboxError(
        f"sandbox provider {provider!r} needs the {module!r} package, which is not installed ({exc}). "
        f"Install it with: {hint}"
    )


def provider_class(name: str) -> type[SandboxProvider]:
    """The provider class registered under ``name`` (raises a clear error when unknown)."""
    from telescope.plugins.facade import get_plugins
    from telescope.plugins.registry import PluginError

    try:
        return get_plugins().sandbox_provider(name)  # checked against SandboxProvider by the facade
    except PluginError as exc:
        hint = INSTALL_HINTS.get(name)
        raise SandboxError(f"{exc}" + (f" Install it with: {hint}" if hint and hint not in str(exc) else "")) from exc


def get_provider(name: str = "local", **kwargs: Any) -> ObservedProvider:
    """Instantiate the provider registered under ``name``, wrapped so that it emits events."""
    return ObservedProvider(provider_class(name)(**kwargs), name)
