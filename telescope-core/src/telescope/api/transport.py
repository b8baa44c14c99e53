"""The weight-transport interface: trainer weights to inference servers, in place.

The trainer side (rank 0) sends full named tensors (Hugging Face names) after each
step; each inference worker receives them and loads them into its running model
without a restart. Implementations: ``memory`` (shared memory, one machine, the
default on CPU) and ``nccl`` (broadcast from trainer rank 0 to every inference
worker process, the default on GPU).

Protocol (the same for every transport, so the orchestrator needs no special case)::

    sender = Transport(context, settings)            # trainer rank 0
    info = sender.prepare_sender(num_receivers)      # JSON-able, e.g. a rendezvous address
    # each inference process (server or vLLM worker), once:
    receiver = Transport(context, settings); receiver.connect_receiver(info, rank, device)
    # every update, concurrently on both sides:
    sender.send(named_weights, version)              # returns when the data is out
    for name, tensor in receiver.receive(version):   # yields as data arrives
        load(name, tensor)

``rank`` counts receivers from 1 (the sender is rank 0); a vLLM server with
tensor parallelism ``tp`` holds ``tp`` receivers (every TP rank gets the full
weights and shards them itself). ``send`` and ``receive`` of one version must be
running at the same time for a collective transport (NCCL), so the orchestrator
starts both together; the memory transport makes ``receive`` wait for each
tensor to be written. The tensors ``receive`` yields stay valid until the next
``receive``.

``streams_while_sent``: True when ``receive`` yields each tensor while the sender
is still writing later ones, so a receiver that loads each tensor as it comes
finishes about when the sender does (the embedded engine then loads them paused,
one at a time); False (the default) tells the receiver to take the whole version
first, as NCCL's receive, whose transfer is long, lets decoding go on meanwhile.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from telescope.api.context import TransportContext
    from telescope.api.settings import PluginSettings


class WeightTransport(ABC):
    """Base class of weight transports."""

    name: ClassVar[str] = ""
    #: ``receive`` yields each tensor while later ones are still being sent (see the module docstring)
    streams_while_sent: ClassVar[bool] = False

    def __init__(self, context: TransportContext | None = None, settings: PluginSettings | None = None) -> None:
        from telescope.api.context import TransportContext

        self.context = context if context is not None else TransportContext()
        self.settings = settings

    def prepare_sender(self, num_receivers: int) -> dict[str, Any]:
        """Trainer side, once: set up and return what receivers need to connect (JSON-able)."""
        return {}

    def connect_receiver(self, init_info: dict[str, Any], rank: int, device: str = "cpu") -> None:
        """Inference side, once per receiving process: join the sender described by ``init_info``."""

    @abstractmethod
    def send(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Trainer side: publish the weights of policy ``version``."""

    @abstractmethod
    def receive(self, version: int) -> Iterator[tuple[str, torch.Tensor]]:
        """Inference side: yield the named tensors of policy ``version``."""

    def close(self) -> None:
        """Release buffers and communicators."""
