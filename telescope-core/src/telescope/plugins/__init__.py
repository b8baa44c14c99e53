"""The plugin system: hook loading (manager) and the table of named plugins (registry)."""

from telescope.plugins.manager import (
    BUILTIN_PLUGINS,
    PluginImportWarning,
    TelescopePluginManager,
    get_plugin_manager,
    reset_plugin_manager,
)
from telescope.plugins.registry import (
    DuplicatePluginError,
    PluginEntry,
    PluginError,
    PluginKind,
    PluginLoadError,
    Registrar,
    Registry,
    UnknownPluginError,
)

__all__ = [
    "BUILTIN_PLUGINS",
    "DuplicatePluginError",
    "PluginEntry",
    "PluginError",
    "PluginImportWarning",
    "PluginKind",
    "PluginLoadError",
    "Registrar",
    "Registry",
    "TelescopePluginManager",
    "UnknownPluginError",
    "get_plugin_manager",
    "reset_plugin_manager",
]
