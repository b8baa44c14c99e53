"""The typed facade through which the core obtains every plugin.

:class:`Plugins` wraps the plugin manager (loading, hooks) and the registry
(names): one accessor per plugin kind returns the registered class, imported on
first use and checked once against the kind's interface, so the rest of the
core works with ``type[TrainerBackend]``, never ``Any``. A wrong base class is a
:class:`PluginTypeError` naming the plugin, its target and its distribution.
``create_*`` builds a plugin the way a run does: with its own settings (the
fields it declared, read from the loaded config) and the narrow context of its
kind. Lifecycle hooks are called through typed methods that contain a failing
observer (a warning; the run goes on).

Like tox's ``MANAGER``, one instance per process (:func:`get_plugins`), rebuilt
with :func:`telescope.plugins.manager.reset_plugin_manager` in tests.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from telescope.plugins.registry import PluginError, PluginKind, Registry

if TYPE_CHECKING:
    import click

    from telescope.api.algorithm import Algorithm
    from telescope.api.browser import BrowserProvider
    from telescope.api.compaction import Compactor
    from telescope.api.environment import EnvironmentBase
    from telescope.api.evals import EvalSpec
    from telescope.api.inference import InferenceBackend
    from telescope.api.logger import Logger
    from telescope.api.sandbox import SandboxProvider
    from telescope.api.settings import PluginSettings
    from telescope.api.trainer import TrainerBackend
    from telescope.api.transport import WeightTransport
    from telescope.plugins.manager import TelescopePluginManager
    from telescope.schema.config import TelescopeConfig

log = logging.getLogger("telescope.plugins")
T = TypeVar("T")


class PluginTypeError(PluginError):
    """A registered object is not of its kind's interface."""


def _interface(kind: PluginKind) -> type:
    from telescope import api
    from telescope.api.compaction import Compactor

    interfaces: dict[PluginKind, type] = {
        PluginKind.ENVIRONMENT: api.EnvironmentBase,
        PluginKind.EVAL: api.EvalSpec,
        PluginKind.ALGORITHM: api.Algorithm,
        PluginKind.TRAINER_BACKEND: api.TrainerBackend,
        PluginKind.INFERENCE_BACKEND: api.InferenceBackend,
        PluginKind.WEIGHT_TRANSPORT: api.WeightTransport,
        PluginKind.SANDBOX_PROVIDER: api.SandboxProvider,
        PluginKind.BROWSER_PROVIDER: api.BrowserProvider,
        PluginKind.LOGGER: api.Logger,
        PluginKind.COMPACTION: Compactor,
    }
    return interfaces[kind]


class Plugins:
    """Typed access to registered plugins and lifecycle hooks (see the module docstring)."""

    def __init__(self, manager: TelescopePluginManager, registry: Registry | None = None) -> None:
        self.manager = manager
        self._registry = registry  # fixed (tests), else the manager's current one
        self._checked: dict[tuple[PluginKind, str], Any] = {}
        self._checked_for: Registry | None = None

    @property
    def registry(self) -> Registry:
        return self._registry if self._registry is not None else self.manager.registry

    # ---------------------------------------------------------------- lookups

    def _get(self, kind: PluginKind, name: str, expected: type[T]) -> T:
        key = (kind, name)
        if self._checked_for is not self.registry:  # plugins were added: check again
            self._checked, self._checked_for = {}, self.registry
        if key not in self._checked:
            entry = self.registry.entry(kind, name)
            obj = entry.load()
            interface = _interface(kind)
            ok = (
                isinstance(obj, interface)
                if kind is PluginKind.EVAL
                else (isinstance(obj, type) and issubclass(obj, interface))
            )
            if not ok:
                what = "an instance" if kind is PluginKind.EVAL else "a subclass"
                raise PluginTypeError(
                    f"{kind.label} {name!r} (from {entry.provider}) resolves to {obj!r} ({entry.target!r}), "
                    f"which is not {what} of {interface.__module__}.{interface.__qualname__}; "
                    f"fix the plugin's registration or block it with TELESCOPE_DISABLE_PLUGINS={entry.plugin}"
                )
            self._checked[key] = obj
        return cast(T, self._checked[key])

    def algorithm(self, name: str) -> type[Algorithm]:
        return self._get(PluginKind.ALGORITHM, name, type)

    def environment(self, name: str) -> type[EnvironmentBase]:
        return self._get(PluginKind.ENVIRONMENT, name, type)

    def eval_spec(self, name: str) -> EvalSpec:
        from telescope.api.evals import EvalSpec

        return self._get(PluginKind.EVAL, name, EvalSpec)

    def trainer_backend(self, name: str) -> type[TrainerBackend]:
        return self._get(PluginKind.TRAINER_BACKEND, name, type)

    def inference_backend(self, name: str) -> type[InferenceBackend]:
        return self._get(PluginKind.INFERENCE_BACKEND, name, type)

    def weight_transport(self, name: str) -> type[WeightTransport]:
        return self._get(PluginKind.WEIGHT_TRANSPORT, name, type)

    def sandbox_provider(self, name: str) -> type[SandboxProvider]:
        return self._get(PluginKind.SANDBOX_PROVIDER, name, type)

    def browser_provider(self, name: str) -> type[BrowserProvider]:
        return self._get(PluginKind.BROWSER_PROVIDER, name, type)

    def logger(self, name: str) -> type[Logger]:
        return self._get(PluginKind.LOGGER, name, type)

    def compactor(self, name: str) -> type[Compactor]:
        return self._get(PluginKind.COMPACTION, name, type)

    def settings_model(self, kind: PluginKind, name: str) -> type[PluginSettings] | None:
        """The settings model a plugin declared at registration, or None."""
        from telescope.api.settings import PluginSettings

        entry = self.registry.entry(kind, name)
        model = entry.settings_model()
        if model is not None and not (isinstance(model, type) and issubclass(model, PluginSettings)):
            raise PluginTypeError(
                f"{kind.label} {name!r} (from {entry.provider}) declares settings {model!r}, which is not a "
                "subclass of telescope.api.settings.PluginSettings"
            )
        return model

    def settings_for(self, kind: PluginKind, name: str, config: TelescopeConfig) -> PluginSettings | None:
        """The plugin's own settings, read from a loaded config (None if it declared none)."""
        model = self.settings_model(kind, name)
        return None if model is None else config.settings(model)

    # ------------------------------------------------------------ construction

    def create_algorithm(self, config: TelescopeConfig) -> Algorithm:
        """``config.algorithm`` with its :class:`AlgorithmConfig` and its own settings."""
        from telescope.api.algorithm import AlgorithmConfig

        cls = self.algorithm(config.algorithm)
        settings = self.settings_for(PluginKind.ALGORITHM, config.algorithm, config)
        return cls(AlgorithmConfig.from_config(config, cls.capabilities), settings)

    def create_trainer_backend(self, config: TelescopeConfig, algorithm: Algorithm) -> TrainerBackend:
        from telescope.api.context import TrainerContext

        name = config.train_backend
        settings = self.settings_for(PluginKind.TRAINER_BACKEND, name, config)
        return self.trainer_backend(name)(TrainerContext.from_config(config), algorithm, settings)

    def create_inference_backend(
        self, name: str, config: TelescopeConfig, access_token: str | None = None
    ) -> InferenceBackend:
        """A backend as a run builds one; its servers ask for ``access_token`` (the run token) when given."""
        import dataclasses

        from telescope.api.context import InferenceContext

        settings = self.settings_for(PluginKind.INFERENCE_BACKEND, name, config)
        context = dataclasses.replace(InferenceContext.from_config(config), access_token=access_token)
        return self.inference_backend(name)(context, settings)

    def create_weight_transport(self, name: str, config: TelescopeConfig) -> WeightTransport:
        """A transport as a run builds one: its own settings and the transport context."""
        from telescope.api.context import TransportContext

        settings = self.settings_for(PluginKind.WEIGHT_TRANSPORT, name, config)
        return self.weight_transport(name)(TransportContext.from_config(config), settings)

    def create_compactor(self, config: TelescopeConfig) -> Compactor | None:
        """``config.compaction`` with the compaction context and its own settings; None when it is ``none``."""
        from telescope.api.context import CompactionContext

        name = config.compaction
        if name == "none":
            return None
        settings = self.settings_for(PluginKind.COMPACTION, name, config)
        return self.compactor(name)(CompactionContext.from_config(config), settings)

    def create_loggers(self, config: TelescopeConfig, run_dir: Path) -> list[Logger]:
        """Every registered logger whose settings enable it; a logger that fails to start is skipped."""
        from telescope.api.context import LoggerContext

        context = LoggerContext.from_config(config, str(run_dir))
        loggers: list[Logger] = []
        for name in self.registry.names(PluginKind.LOGGER):
            try:
                cls = self.logger(name)
                settings = self.settings_for(PluginKind.LOGGER, name, config)
                if cls.enabled(settings):
                    loggers.append(cls(context, settings))
            except Exception as exc:  # a logger never stops a run
                print(f"warning: logger {name!r} is disabled: {exc}", file=sys.stderr)
        return loggers

    # ---------------------------------------------------------------- lifecycle

    def _observe(self, hook: str, **kwargs: Any) -> None:
        """Call every implementation of a lifecycle hook; one that raises is reported and the others still run."""
        for impl in reversed(getattr(self.manager.pm.hook, hook).get_hookimpls()):  # pluggy's call order
            try:
                self.manager.call_one(hook, impl.plugin_name, **kwargs)
            except Exception as exc:  # an observer never changes how the run goes
                log.warning("the %s hook of plugin %r failed: %s", hook, impl.plugin_name, exc)
                print(f"warning: the {hook} hook of plugin {impl.plugin_name!r} failed: {exc}", file=sys.stderr)

    def run_start(self, config: TelescopeConfig, run_dir: Path) -> None:
        self._observe("telescope_run_start", config=config, run_dir=run_dir)

    def step_end(self, step: int, metrics: dict[str, Any]) -> None:
        self._observe("telescope_step_end", step=step, metrics=metrics)

    def run_end(self, run_dir: Path, status: str, error: BaseException | None) -> None:
        self._observe("telescope_run_end", run_dir=run_dir, status=status, error=error)

    def add_commands(self, cli: click.Group) -> None:
        self.manager.pm.hook.telescope_add_commands(cli=cli)

    def validate_config(self, config: TelescopeConfig) -> list[str]:
        """Problems that plugins' ``telescope_validate_config`` implementations report."""
        problems: list[str] = []
        for result in self.manager.pm.hook.telescope_validate_config(config=config):
            problems.extend(result or [])
        return problems


_PLUGINS: tuple[TelescopePluginManager, Plugins] | None = None


def get_plugins() -> Plugins:
    """The facade over the process-wide plugin manager."""
    global _PLUGINS
    from telescope.plugins.manager import get_plugin_manager

    manager = get_plugin_manager()
    if _PLUGINS is None or _PLUGINS[0] is not manager:
        _PLUGINS = (manager, Plugins(manager))
    return _PLUGINS[1]
