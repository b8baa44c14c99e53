"""Optional dependencies: imported when an environment is used, with an install hint.

An environment module never imports an optional package at import time, so
``telescope plugins`` lists every environment whether or not its extras are
installed; using one without its extra raises :class:`MissingDependencyError`
saying which ``pip install`` fixes it.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingDependencyError(ImportError):
    """An optional package an environment needs is not installed."""


def require(module: str, extra: str, environment: str) -> ModuleType:
    """Import ``module`` or raise an error naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"environment {environment!r} needs the {module!r} package ({exc}). "
            f"Install it with: pip install 'telescope-envs[{extra}]'"
        ) from exc
