"""The logger interface: where step metrics, rollouts and events go besides the run store.

The local run store always records everything; loggers (W&B, ...) are plugins on
top, enabled by the config. A logger that fails is reported and disabled; it never
stops a run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from telescope.api.context import LoggerContext
    from telescope.api.settings import PluginSettings


class Logger(ABC):
    """Base class of loggers."""

    name: ClassVar[str] = ""

    def __init__(self, context: LoggerContext, settings: PluginSettings | None = None) -> None:
        self.context = context
        self.settings = settings
        self.run_dir = Path(context.run_dir)

    @classmethod
    def enabled(cls, settings: PluginSettings | None) -> bool:
        """Whether the logger's own settings ask for it (e.g. ``use_wandb``)."""
        return False

    @abstractmethod
    def log_step(self, step: int, metrics: dict[str, Any]) -> None:
        """Record one step's metrics."""

    def log_rollouts(self, step: int, rollouts: list[dict[str, Any]]) -> None:
        """Record the step's rollouts (JSON-ready dicts); optional."""

    def log_eval(self, name: str, step: int, metrics: dict[str, Any], **extra: Any) -> None:
        """Record one eval's results at ``step`` (default: as step metrics)."""
        self.log_step(step, metrics)

    def log_event(self, event: dict[str, Any]) -> None:
        """Record a timeline event; optional.

        ``telescope run`` subscribes every logger to the run's event bus
        (:mod:`telescope.api.events`), so this is called from any thread, often:
        buffer, never block.
        """

    def close(self) -> None:
        """Flush and finish."""
