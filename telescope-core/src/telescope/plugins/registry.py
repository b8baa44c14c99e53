"""The registry of named plugins: which names exist, of what kind, from which package.

Design:

- One :class:`Registry` per process holds a table per :class:`PluginKind`.
- A plugin registers through a :class:`Registrar` bound to one kind and to the
  plugin (so the registry knows the distribution that provided every name).
- A target is either the object itself or a lazy ``"module:attribute"`` string,
  resolved on first :meth:`PluginEntry.load`; registering a name never imports the
  heavy stack (torch, transformers, ray, vllm).
- A name registered twice by different plugins is a *clash*: both entries are
  kept (``telescope plugins`` lists both, marked), and only looking the name up
  fails, with :class:`DuplicatePluginError` naming both distributions; every
  command that does not use the name keeps working. Looking up an unknown name
  fails with :class:`UnknownPluginError`, which lists the registered names and
  the closest match.
- Registration metadata the registry itself understands: ``settings`` (the
  plugin's :class:`~telescope.api.settings.PluginSettings` model, or a lazy
  ``"module:Class"`` for it) and ``install_hint`` (what to install when the
  target cannot be imported, e.g. an optional SDK; the satellite declares its own
  hints, the core names no satellite). The rest is kind-specific (algorithm
  capabilities).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class PluginKind(StrEnum):
    """The kinds of named plugins; the value is the registration hook's suffix."""

    ENVIRONMENT = "environments"
    EVAL = "evals"
    ALGORITHM = "algorithms"
    TRAINER_BACKEND = "trainer_backends"
    INFERENCE_BACKEND = "inference_backends"
    WEIGHT_TRANSPORT = "weight_transports"
    SANDBOX_PROVIDER = "sandbox_providers"
    BROWSER_PROVIDER = "browser_providers"
    LOGGER = "loggers"
    COMPACTION = "compactions"

    @property
    def label(self) -> str:
        """Singular, human-readable label, e.g. ``trainer backend``."""
        return self.value[:-1].replace("_", " ")

    @property
    def hook_name(self) -> str:
        return f"telescope_register_{self.value}"


class PluginError(Exception):
    """Base class of plugin-system errors; the message is meant for the user."""


class DuplicatePluginError(PluginError):
    pass


class UnknownPluginError(PluginError):
    pass


class PluginLoadError(PluginError):
    pass


@dataclass
class PluginEntry:
    """One registered name."""

    kind: PluginKind
    name: str
    target: Any
    plugin: str
    distribution: str | None = None
    version: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    _loaded: Any = field(default=None, repr=False)

    @property
    def provider(self) -> str:
        """The distribution (or plugin) that registered this name, for messages."""
        if self.distribution:
            return f"{self.distribution} {self.version or ''}".strip()
        return f"plugin {self.plugin!r}"

    @property
    def is_lazy(self) -> bool:
        return isinstance(self.target, str)

    def load(self) -> Any:
        """Return the registered object, importing it first if it was registered lazily."""
        if self._loaded is None:
            self._loaded = self._resolve(self.target, "")
        return self._loaded

    def settings_model(self) -> Any:
        """The plugin's settings model (``settings`` metadata, imported if lazy), or None."""
        declared = self.metadata.get("settings")
        return None if declared is None else self._resolve(declared, "settings ")

    def _resolve(self, target: Any, what: str) -> Any:
        if not isinstance(target, str):
            return target
        module_name, _, attribute = target.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attribute.split(".") if attribute else []:
                obj = getattr(obj, part)
        except ImportError as exc:
            hint = self.metadata.get("install_hint")
            fix = f"Install it: {hint}." if hint else "Install its missing dependency"
            raise PluginLoadError(
                f"{self.kind.label} {self.name!r} (from {self.provider}) could not be imported: {exc}. "
                f"{fix}, or choose another {self.kind.label}."
            ) from exc
        except AttributeError as exc:
            raise PluginLoadError(
                f"{self.kind.label} {self.name!r} (from {self.provider}) points {what}to "
                f"{target!r}, which does not exist: {exc}"
            ) from exc
        return obj


class Registry:
    """All registered names, by kind."""

    def __init__(self) -> None:
        self._entries: dict[PluginKind, dict[str, PluginEntry]] = {k: {} for k in PluginKind}
        self._clashes: dict[PluginKind, dict[str, list[PluginEntry]]] = {k: {} for k in PluginKind}

    def add(self, entry: PluginEntry) -> None:
        """Add a name; a name another plugin already holds becomes a clash (kept, unusable)."""
        table = self._entries[entry.kind]
        clashing = self._clashes[entry.kind]
        if entry.name in clashing:
            clashing[entry.name].append(entry)
        elif entry.name in table:
            existing = table.pop(entry.name)
            if existing.plugin == entry.plugin:
                table[entry.name] = existing
                raise PluginError(
                    f"plugin {entry.plugin!r} registered {entry.kind.label} {entry.name!r} twice; register it once"
                )
            clashing[entry.name] = [existing, entry]
        else:
            table[entry.name] = entry

    def remove_plugin(self, plugin: str) -> None:
        """Drop every name a plugin registered (used when its registration failed midway)."""
        for table in self._entries.values():
            for name in [n for n, e in table.items() if e.plugin == plugin]:
                del table[name]

    def names(self, kind: PluginKind) -> list[str]:
        """Usable names (clashing names are left out: they cannot be chosen)."""
        return sorted(self._entries[kind])

    def has(self, kind: PluginKind, name: str) -> bool:
        return name in self._entries[kind] or name in self._clashes[kind]

    def clashes(self) -> Iterator[PluginEntry]:
        """Every entry of every clashing name, for ``telescope plugins``."""
        for kind in PluginKind:
            for name in sorted(self._clashes[kind]):
                yield from self._clashes[kind][name]

    def entry(self, kind: PluginKind, name: str) -> PluginEntry:
        clash = self._clashes[kind].get(name)
        if clash:
            providers = " and by ".join(e.provider for e in clash)
            raise DuplicatePluginError(
                f"{kind.label} name {name!r} is registered more than once: by {providers}. "
                "Uninstall all but one of those packages, or block one plugin with "
                f"TELESCOPE_DISABLE_PLUGINS={clash[-1].plugin}."
            )
        try:
            return self._entries[kind][name]
        except KeyError:
            raise UnknownPluginError(self.unknown_name_message(kind, name)) from None

    def get(self, kind: PluginKind, name: str) -> Any:
        """Return the loaded object registered under ``name``."""
        return self.entry(kind, name).load()

    def __iter__(self) -> Iterator[PluginEntry]:
        for kind in PluginKind:
            yield from (self._entries[kind][n] for n in sorted(self._entries[kind]))

    def unknown_name_message(self, kind: PluginKind, name: str) -> str:
        names = self.names(kind)
        parts = [f"unknown {kind.label} {name!r}."]
        parts.append(
            f"Registered {kind.value.replace('_', ' ')}: {', '.join(names)}."
            if names
            else f"No {kind.value.replace('_', ' ')} are registered."
        )
        close = difflib.get_close_matches(name, names, n=1)
        if close:
            parts.append(f"Did you mean {close[0]!r}?")
        else:
            parts.append(f"If a package provides {name!r}, install it (`telescope plugins` lists what is installed).")
        return " ".join(parts)


class Registrar:
    """What a registration hook receives: ``register(name, target, **metadata)``.

    Bound to one kind and one plugin, so every name records where it came from.
    """

    def __init__(
        self,
        registry: Registry,
        kind: PluginKind,
        plugin: str,
        distribution: str | None,
        version: str | None,
    ) -> None:
        self._registry = registry
        self.kind = kind
        self.plugin = plugin
        self.distribution = distribution
        self.version = version

    def __call__(self, name: str, target: Any, **metadata: Any) -> None:
        if not isinstance(name, str) or not name:
            raise PluginError(
                f"plugin {self.plugin!r} registered a {self.kind.label} with an invalid "
                f"name {name!r}: names are non-empty strings"
            )
        if isinstance(target, str) and ":" not in target:
            raise PluginError(
                f"plugin {self.plugin!r} registered {self.kind.label} {name!r} with target "
                f"{target!r}; a lazy target is written 'package.module:Attribute'"
            )
        self._registry.add(
            PluginEntry(
                kind=self.kind,
                name=name,
                target=target,
                plugin=self.plugin,
                distribution=self.distribution,
                version=self.version,
                metadata=dict(metadata),
            )
        )
