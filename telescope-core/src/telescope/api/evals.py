"""The eval interface: a named benchmark run on the inference servers.

A dedicated eval (``math500``, ``aime_2024``, ...) is an :class:`EvalSpec`: the
environment class that scores it and the dataset arguments it uses. Any
registered environment can also be evaluated by its own name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from telescope.api.environment import EnvironmentBase


@dataclass(frozen=True)
class EvalSpec:
    """A dedicated eval: an environment class and its default keyword arguments."""

    name: str
    environment: type[EnvironmentBase]
    default_kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def build(self, **kwargs: Any) -> EnvironmentBase:
        """The environment that serves this eval (config kwargs override the defaults)."""
        return self.environment(**{**self.default_kwargs, **kwargs})
