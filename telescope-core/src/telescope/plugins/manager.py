"""A typed facade over pluggy's plugin manager: load order, entry points, the registry.

Load order (explicit, like tox's): first the core's built-ins, the modules named in
:data:`BUILTIN_PLUGINS`; then every module published in the ``telescope``
entry-point group by an installed distribution (telescope-envs, telescope-sandbox,
third parties). Built-ins go through the same hooks as everyone else.

Containment: a plugin that fails to import, or whose registration hook raises, is
recorded in :attr:`TelescopePluginManager.load_failures`, reported as a
:class:`PluginImportWarning` and shown by ``telescope plugins``; every command that
does not need it keeps working. A name registered by two plugins is kept as a
clash (see :mod:`telescope.plugins.registry`): only what uses that name fails.

Loud: a hook implementation whose name matches no hook spec (a typo such as
``telescope_run_ended``) is an error right after loading (pluggy's
``check_pending``), naming the plugin and the closest hook, because a silently
ignored hook is a bug that nothing else would reveal.

The core reaches the plugins only through the typed facade
:class:`telescope.plugins.facade.Plugins`; this module is its loader.

Environment variables:

- ``TELESCOPE_DISABLE_PLUGINS``: comma-separated plugin names (entry-point names or
  built-in module names) or distribution names to block.
- ``TELESCOPE_TRACE_PLUGINS=1``: print every hook call to stderr.

Why the registration and lifecycle hooks are called one implementation at a time
rather than through ``pm.hook``: each registration call gets a registrar that knows
which plugin and distribution it serves, which is how a duplicate name can name both
packages, and a failing plugin can be contained without losing the others' names (an
observer that raises, likewise, must not stop the others). Each such call still goes
through pluggy (:meth:`TelescopePluginManager.call_one`, a hook caller restricted to
one plugin), so that every hook call, registration and lifecycle included, is traced.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import pluggy

from telescope.plugins import hookspecs
from telescope.plugins.registry import PluginKind, Registrar, Registry

ENTRY_POINT_GROUP = "telescope"
CORE_DISTRIBUTION = "telescope-core"

#: The core's own plugins, registered in this order through the public hooks.
BUILTIN_PLUGINS: tuple[str, ...] = (
    "telescope.algorithms.plugin",
    "telescope.trainer.plugin",
    "telescope.inference.plugin",
    "telescope.transports.plugin",
    "telescope.recording.plugin",
    "telescope.compaction.plugin",
    "telescope.cli.builtin_commands",
)


class PluginImportWarning(UserWarning):
    """A plugin could not be imported or failed while registering its names."""


@dataclass(frozen=True)
class PluginInfo:
    """Where a loaded plugin came from."""

    name: str
    distribution: str | None
    version: str | None
    builtin: bool


@dataclass(frozen=True)
class PluginLoadFailure:
    """A plugin that could not be imported or registered."""

    name: str
    distribution: str | None
    version: str | None
    error: str

    @property
    def message(self) -> str:
        origin = f" (from {self.distribution} {self.version or ''})".rstrip() if self.distribution else ""
        return f"plugin {self.name!r}{origin} failed to load: {self.error}"


def _core_version() -> str | None:
    from telescope import __version__

    return __version__


def disabled_plugin_names() -> set[str]:
    raw = os.environ.get("TELESCOPE_DISABLE_PLUGINS", "")
    return {part.strip() for part in raw.replace(" ", ",").split(",") if part.strip()}


class TelescopePluginManager:
    """Loads the plugins and builds the :class:`Registry` of named plugins."""

    def __init__(
        self,
        *,
        builtins: tuple[str, ...] = BUILTIN_PLUGINS,
        load_entry_points: bool = True,
        disabled: set[str] | None = None,
    ) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        if os.environ.get("TELESCOPE_TRACE_PLUGINS"):
            self.pm.trace.root.setwriter(sys.stderr.write)
            self.pm.enable_tracing()
        self.disabled = disabled_plugin_names() if disabled is None else set(disabled)
        self.plugins: dict[str, PluginInfo] = {}
        self.load_failures: list[PluginLoadFailure] = []
        self._registry: Registry | None = None
        for module_name in builtins:
            self._load_builtin(module_name)
        if load_entry_points:
            self._load_entry_points()

    def check_hook_names(self) -> None:
        """Raise :class:`PluginError` for a hook implementation that matches no hook spec."""
        import difflib

        from telescope.plugins.registry import PluginError

        known = [name for name in dir(hookspecs) if name.startswith("telescope_")]
        for name, caller in vars(self.pm.hook).items():
            if caller.spec is not None:
                continue
            for impl in caller.get_hookimpls():
                if impl.hookwrapper or impl.wrapper or getattr(impl, "optionalhook", False):
                    continue
                close = difflib.get_close_matches(name, known, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                info = self.plugins.get(impl.plugin_name)
                origin = f" (from {info.distribution})" if info and info.distribution else ""
                raise PluginError(
                    f"plugin {impl.plugin_name!r}{origin} implements {name!r}, which is not a Telescope hook."
                    f"{hint} Every hook is listed in telescope/plugins/hookspecs.py; fix the plugin or block it with "
                    f"TELESCOPE_DISABLE_PLUGINS={impl.plugin_name}."
                )
        self.pm.check_pending()  # whatever pluggy itself still finds wrong

    @property
    def hook(self) -> Any:
        return self.pm.hook

    def call_one(self, hook_name: str, plugin_name: str, **kwargs: Any) -> Any:
        """Call ``plugin_name``'s implementation of ``hook_name`` alone, through pluggy (traced).

        Returns what it returned (None when the plugin does not implement the hook).
        """
        others = [plugin for name, plugin in self.pm.list_name_plugin() if name != plugin_name]
        results = self.pm.subset_hook_caller(hook_name, remove_plugins=others)(**kwargs)
        return results[0] if results else None

    # ---------------------------------------------------------------- loading

    def _is_disabled(self, name: str, distribution: str | None) -> bool:
        return name in self.disabled or (distribution is not None and distribution in self.disabled)

    def _fail(self, name: str, distribution: str | None, version: str | None, error: BaseException) -> None:
        failure = PluginLoadFailure(name, distribution, version, f"{type(error).__name__}: {error}")
        self.load_failures.append(failure)
        warnings.warn(failure.message, PluginImportWarning, stacklevel=3)

    def _load_builtin(self, module_name: str) -> None:
        version = _core_version()
        if self._is_disabled(module_name, None):
            self.pm.set_blocked(module_name)
            return
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # contained: reported, the other plugins still load
            self._fail(module_name, CORE_DISTRIBUTION, version, exc)
            return
        self.register_plugin(module, module_name, CORE_DISTRIBUTION, version, builtin=True)

    def _load_entry_points(self) -> None:
        import importlib_metadata

        seen: set[tuple[str, str]] = set()
        for ep in importlib_metadata.entry_points(group=ENTRY_POINT_GROUP):
            if (ep.name, ep.value) in seen:
                continue
            seen.add((ep.name, ep.value))
            dist = ep.dist.name if ep.dist is not None else None
            version = ep.dist.version if ep.dist is not None else None
            if self._is_disabled(ep.name, dist) or self.pm.is_registered(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # contained: reported, the other plugins still load
                self._fail(ep.name, dist, version, exc)
                continue
            self.register_plugin(plugin, ep.name, dist, version, builtin=False)

    def register_plugin(
        self,
        plugin: object,
        name: str,
        distribution: str | None = None,
        version: str | None = None,
        *,
        builtin: bool = False,
    ) -> None:
        """Register a plugin object (used by the loaders, and by tests directly)."""
        self.pm.register(plugin, name=name)
        self.plugins[name] = PluginInfo(name, distribution, version, builtin)
        self._registry = None
        self.check_hook_names()

    # --------------------------------------------------------------- registry

    @property
    def registry(self) -> Registry:
        """The registry of named plugins, built on first use by the registration hooks."""
        if self._registry is None:
            self._registry = self._build_registry()
        return self._registry

    def _build_registry(self) -> Registry:
        registry = Registry()
        failed: set[str] = set()
        for kind in PluginKind:
            caller = getattr(self.pm.hook, kind.hook_name)
            # get_hookimpls() lists implementations in registration order (built-ins,
            # then entry points), so a duplicate blames the later, third-party name.
            for impl in caller.get_hookimpls():
                if impl.plugin_name in failed:
                    continue
                info = self.plugins.get(impl.plugin_name)
                registrar = Registrar(
                    registry,
                    kind,
                    impl.plugin_name,
                    info.distribution if info else None,
                    info.version if info else None,
                )
                try:
                    self.call_one(kind.hook_name, impl.plugin_name, register=registrar)
                except Exception as exc:  # contained: one broken plugin loses only its names
                    failed.add(impl.plugin_name)
                    registry.remove_plugin(impl.plugin_name)
                    self._fail(
                        impl.plugin_name,
                        info.distribution if info else None,
                        info.version if info else None,
                        exc,
                    )
        return registry


_MANAGER: TelescopePluginManager | None = None


def get_plugin_manager() -> TelescopePluginManager:
    """The process-wide plugin manager, created on first use."""
    global _MANAGER
    if _MANAGER is None:
        _MANAGER = TelescopePluginManager()
    return _MANAGER


def reset_plugin_manager(manager: TelescopePluginManager | None = None) -> None:
    """Replace (or drop) the process-wide manager; for tests and long-lived processes."""
    global _MANAGER
    _MANAGER = manager
