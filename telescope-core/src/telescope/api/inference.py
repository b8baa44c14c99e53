"""The inference-backend interface: start servers that speak the completions API.

A backend starts one server per inference worker. Every server speaks the
subset of vLLM's OpenAI-compatible API that the orchestrator's single client uses
(token ids in and out, log-probabilities, abort, priority) and accepts weight
updates in place. The embedded engine (CPU or GPU) and vLLM (GPU) implement it.

Use :class:`telescope.inference.client.InferenceClient` against ``server.address.base_url``;
weight updates go through the transports of :mod:`telescope.api.transport`, with
receiver ranks ``1 + worker_index * receivers_per_server() + local rank``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from telescope.api.context import InferenceContext
    from telescope.api.settings import PluginSettings


@dataclass(frozen=True)
class ServerAddress:
    """Where a started inference server listens."""

    host: str
    port: int

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


class InferenceServer(ABC):
    """A running server (in-process, subprocess or Ray actor)."""

    @property
    @abstractmethod
    def address(self) -> ServerAddress: ...

    @abstractmethod
    def stop(self) -> None:
        """Stop the server and release its resources."""


class InferenceBackend(ABC):
    """Base class of inference backends."""

    name: ClassVar[str] = ""

    def __init__(self, context: InferenceContext, settings: PluginSettings | None = None) -> None:
        self.context = context
        self.settings = settings

    @classmethod
    def is_available(cls) -> bool:
        """Whether this machine can run the backend (libraries, devices)."""
        return True

    @abstractmethod
    def start_server(self, worker_index: int, run_dir: Path | None = None) -> InferenceServer:
        """Start inference worker ``worker_index`` and return once it is healthy."""

    def receivers_per_server(self) -> int:
        """Weight-transport receivers one server holds (its ranks are ``rank_offset + 0 .. n - 1``).

        1 for the embedded engine; the tensor-parallel size for vLLM, whose
        every TP worker receives the full weights and shards them itself.
        """
        return 1
