"""Build the configured algorithm from the plugin registry (the trainer's and orchestrator's entry)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from telescope.api.algorithm import Algorithm, AlgorithmConfig

if TYPE_CHECKING:
    from telescope.config.schema import TelescopeConfig


def algorithm_class(name: str) -> type[Algorithm]:
    """The registered algorithm class called ``name`` (imports its module)."""
    from telescope.plugins.manager import get_plugin_manager
    from telescope.plugins.registry import PluginKind

    cls = get_plugin_manager().registry.get(PluginKind.ALGORITHM, name)
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError(f"algorithm {name!r} resolves to {cls!r}, which is not an Algorithm subclass")
    return cls


def build_algorithm(config: TelescopeConfig) -> Algorithm:
    """``config.algorithm`` instantiated with its :class:`AlgorithmConfig` slice."""
    cls = algorithm_class(config.algorithm)
    return cls(AlgorithmConfig.from_config(config, cls.capabilities))
