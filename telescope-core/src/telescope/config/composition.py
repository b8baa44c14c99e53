"""One flat schema from what is installed: the core's fields plus every plugin's settings.

The core declares the fields it reads (:class:`~telescope.schema.config.TelescopeConfig`);
every registered plugin may declare the fields it reads as a
:class:`~telescope.api.settings.PluginSettings` model (registration metadata
``settings``). :func:`composed_schema` builds, once per registry, a pydantic model
that subclasses ``TelescopeConfig`` and adds every plugin field with its type,
default, range and description, so the user sees one flat namespace with
``extra="forbid"``: a key that no installed package declares is an unknown key,
with did-you-mean over everything that is installed.

Rules:

- field names are global: a plugin field that is also a core field, or that two
  different settings models declare, is a :class:`~telescope.plugins.registry.PluginError`
  naming both distributions (one model registered under several names is one owner);
- the plugin's own validators run on its slice of the config
  (:meth:`ComposedSchema.settings_problems`), and its cross-field rules
  (:meth:`~telescope.api.settings.PluginSettings.config_problems`) on the whole config;
- the composed class is built dynamically and cannot be pickled: configs cross
  process boundaries as JSON (:func:`config_from_json`) or as narrow contexts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError, create_model

from telescope.plugins.registry import PluginError
from telescope.schema.config import SECTIONS, TelescopeConfig

if TYPE_CHECKING:
    from telescope.api.settings import PluginSettings
    from telescope.plugins.facade import Plugins


@dataclass(frozen=True)
class SettingsOwner:
    """Who declared a settings model: the model, its distribution and the names it serves."""

    model: type[PluginSettings]
    distribution: str
    plugins: tuple[str, ...]


@dataclass
class ComposedSchema:
    """The composed config class and where each plugin field came from."""

    model: type[TelescopeConfig]
    owners: list[SettingsOwner] = field(default_factory=list)
    field_owner: dict[str, SettingsOwner] = field(default_factory=dict)

    def section(self, name: str) -> str:
        owner = self.field_owner.get(name)
        return owner.model.section if owner is not None else SECTIONS.get(name, "other")

    def sections(self) -> dict[str, list[str]]:
        """Field names by section: the core's sections in reference order, plugin fields merged in."""
        out: dict[str, list[str]] = {}
        for name in self.model.model_fields:
            out.setdefault(self.section(name), []).append(name)
        return out

    def owner_label(self, name: str) -> str:
        owner = self.field_owner.get(name)
        return "telescope-core" if owner is None else owner.distribution

    def settings_problems(self, config: TelescopeConfig) -> list[tuple[str, tuple[str, ...]]]:
        """Each plugin's validators on its slice, then its cross-field rules: (message, fields)."""
        problems: list[tuple[str, tuple[str, ...]]] = []
        for owner in self.owners:
            try:
                owner.model.model_validate({n: getattr(config, n) for n in owner.model.model_fields})
            except ValidationError as exc:
                for err in exc.errors():
                    names = tuple(str(p) for p in err["loc"][:1])
                    problems.append(
                        (
                            f"{'.'.join(str(p) for p in err['loc']) or owner.model.__name__}: "
                            f"{err['msg'].removeprefix('Value error, ')}",
                            names,
                        )
                    )
                continue
            for problem in owner.model.config_problems(config):
                problems.append((str(problem), tuple(getattr(problem, "fields", ()))))
        return problems


def compose(plugins: Plugins) -> ComposedSchema:
    """Build the composed schema from the registered plugins' settings (see the module docstring)."""
    by_model: dict[type[PluginSettings], list[tuple[str, str]]] = {}
    distributions: dict[type[PluginSettings], str] = {}
    for entry in plugins.registry:
        model = plugins.settings_model(entry.kind, entry.name)
        if model is None:
            continue
        by_model.setdefault(model, []).append((entry.kind.label, entry.name))
        distributions.setdefault(model, entry.distribution or f"plugin {entry.plugin!r}")
    owners: list[SettingsOwner] = []
    field_owner: dict[str, SettingsOwner] = {}
    extra: dict[str, Any] = {}
    for model, served in by_model.items():
        owner = SettingsOwner(model, distributions[model], tuple(f"{kind} {name!r}" for kind, name in served))
        owners.append(owner)
        for name, info in model.model_fields.items():
            if name in TelescopeConfig.model_fields:
                raise PluginError(
                    f"config field {name!r} is declared by {owner.distribution} ({model.__name__}, for "
                    f"{', '.join(owner.plugins)}) and by telescope-core; field names are global: rename the "
                    "plugin's field"
                )
            if name in field_owner:
                other = field_owner[name]
                raise PluginError(
                    f"config field {name!r} is declared twice: by {other.distribution} ({other.model.__name__}) "
                    f"and by {owner.distribution} ({model.__name__}); field names are global: one of the two "
                    "packages must rename it (or uninstall one)"
                )
            field_owner[name] = owner
            extra[name] = (info.annotation, copy.copy(info))
    model_class = create_model("TelescopeRunConfig", __base__=TelescopeConfig, **extra)
    model_class.__doc__ = "Every parameter of a Telescope run: the core's and the installed plugins'."
    return ComposedSchema(model_class, owners, field_owner)


_CACHE: dict[int, tuple[object, ComposedSchema]] = {}


def composed_schema(plugins: Plugins | None = None) -> ComposedSchema:
    """The composed schema of the process's plugins (built once per registry)."""
    if plugins is None:
        from telescope.plugins.facade import get_plugins

        plugins = get_plugins()
    registry = plugins.registry
    cached = _CACHE.get(id(plugins))
    if cached is None or cached[0] is not registry:
        cached = (registry, compose(plugins))
        _CACHE.clear()
        _CACHE[id(plugins)] = cached
    return cached[1]


def config_from_json(text: str) -> TelescopeConfig:
    """A resolved config sent as JSON (to a worker process), validated with the composed schema."""
    return composed_schema().model.model_validate_json(text)


def config_from_dict(data: dict[str, Any]) -> TelescopeConfig:
    return composed_schema().model.model_validate(data)
