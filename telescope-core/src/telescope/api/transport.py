"""The weight-transport interface: trainer weights to inference servers, in place.

The trainer side sends full named tensors after each step; each inference worker
receives them and loads them into its running model without a restart. In-memory
(one machine) and NCCL broadcast (GPU) implement it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch

    from telescope.config.schema import TelescopeConfig


class WeightTransport(ABC):
    """Base class of weight transports."""

    name: ClassVar[str] = ""

    def __init__(self, config: TelescopeConfig) -> None:
        self.config = config

    @abstractmethod
    def send(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Trainer side: publish the weights of policy ``version``."""

    @abstractmethod
    def receive(self, version: int) -> Iterator[tuple[str, torch.Tensor]]:
        """Inference side: yield the named tensors of policy ``version``."""

    def close(self) -> None:
        """Release buffers and communicators."""
