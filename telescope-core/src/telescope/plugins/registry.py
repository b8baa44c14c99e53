"""The registry of named plugins: which names exist, of what kind, from which package.

Design:

- One :class:`Registry` per process holds a table per :class:`PluginKind`.
- A plugin registers through a :class:`Registrar` bound to one kind and to the
  plugin (so the registry knows the distribution that provided every name).
- A target is either the object itself or a lazy ``"module:attribute"`` string,
  resolved on first :meth:`PluginEntry.load`; registering a name never imports the
  heavy stack (torch, transformers, ray, vllm).
- A name registered twice fails with :class:`DuplicatePluginError`, naming both
  distributions. Looking up an unknown name fails with
  :class:`UnknownPluginError`, which lists the registered names, the closest match
  and, when a known package provides it, the ``pip install`` that adds it.
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
    LOGGER = "loggers"

    @property
    def label(self) -> str:
        """Singular, human-readable label, e.g. ``trainer backend``."""
        return self.value[:-1].replace("_", " ")

    @property
    def hook_name(self) -> str:
        return f"telescope_register_{self.value}"


# Names that packages known to the project provide, for install hints when a
# config names one that is not installed.
KNOWN_PROVIDERS: dict[tuple[PluginKind, str], str] = {
    (PluginKind.ENVIRONMENT, "countdown"): "telescope-envs",
    (PluginKind.ENVIRONMENT, "hendrycks_math"): "telescope-envs",
    (PluginKind.ENVIRONMENT, "wordle"): "telescope-envs",
    (PluginKind.ENVIRONMENT, "i3_code"): "telescope-envs",
    (PluginKind.ENVIRONMENT, "calculator"): "telescope-envs",
    (PluginKind.EVAL, "math500"): "telescope-envs",
    (PluginKind.EVAL, "aime_2024"): "telescope-envs",
    (PluginKind.EVAL, "aime_2025"): "telescope-envs",
    (PluginKind.EVAL, "gpqa_diamond"): "telescope-envs",
    (PluginKind.TRAINER_BACKEND, "megatron"): "telescope-megatron",
    (PluginKind.SANDBOX_PROVIDER, "local"): "telescope-sandbox",
    (PluginKind.SANDBOX_PROVIDER, "e2b"): "telescope-sandbox[e2b]",
    (PluginKind.SANDBOX_PROVIDER, "modal"): "telescope-sandbox[modal]",
    (PluginKind.SANDBOX_PROVIDER, "daytona"): "telescope-sandbox[daytona]",
    (PluginKind.SANDBOX_PROVIDER, "prime"): "telescope-sandbox[prime]",
    (PluginKind.LOGGER, "wandb"): "telescope-core[wandb]",
}


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
        if not isinstance(self.target, str):
            return self.target
        if self._loaded is None:
            module_name, _, attribute = self.target.partition(":")
            try:
                obj: Any = importlib.import_module(module_name)
                for part in attribute.split(".") if attribute else []:
                    obj = getattr(obj, part)
            except ImportError as exc:
                raise PluginLoadError(
                    f"{self.kind.label} {self.name!r} (from {self.provider}) could not be "
                    f"imported: {exc}. Install its missing dependency, or choose another "
                    f"{self.kind.label}."
                ) from exc
            except AttributeError as exc:
                raise PluginLoadError(
                    f"{self.kind.label} {self.name!r} (from {self.provider}) points to "
                    f"{self.target!r}, which does not exist: {exc}"
                ) from exc
            self._loaded = obj
        return self._loaded


class Registry:
    """All registered names, by kind."""

    def __init__(self) -> None:
        self._entries: dict[PluginKind, dict[str, PluginEntry]] = {k: {} for k in PluginKind}

    def add(self, entry: PluginEntry) -> None:
        table = self._entries[entry.kind]
        existing = table.get(entry.name)
        if existing is not None:
            raise DuplicatePluginError(
                f"{entry.kind.label} name {entry.name!r} is registered twice: by "
                f"{existing.provider} and by {entry.provider}. Uninstall one of the two "
                f"packages, or block one plugin with TELESCOPE_DISABLE_PLUGINS="
                f"{entry.plugin}."
            )
        table[entry.name] = entry

    def remove_plugin(self, plugin: str) -> None:
        """Drop every name a plugin registered (used when its registration failed midway)."""
        for table in self._entries.values():
            for name in [n for n, e in table.items() if e.plugin == plugin]:
                del table[name]

    def names(self, kind: PluginKind) -> list[str]:
        return sorted(self._entries[kind])

    def has(self, kind: PluginKind, name: str) -> bool:
        return name in self._entries[kind]

    def entry(self, kind: PluginKind, name: str) -> PluginEntry:
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
        provider = KNOWN_PROVIDERS.get((kind, name))
        if provider:
            parts.append(f"{name!r} is provided by {provider}: pip install '{provider}'.")
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
