"""Weight transports: trainer weights to inference servers, in place.

``memory`` (:mod:`.memory`, shared memory on one machine, the CPU default) and
``nccl`` (:mod:`.nccl`, broadcast from trainer rank 0, the GPU default); the
protocol is described in :mod:`telescope.api.transport`. This package imports
nothing heavy until a transport is created.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from telescope.api.transport import WeightTransport
    from telescope.config.schema import TelescopeConfig


def default_transport_name(gpu: bool | None = None) -> str:
    """``nccl`` when CUDA is usable, else ``memory`` (what ``weight_transport: auto`` means).

    ``gpu`` says whether the workers will have GPUs (a Ray cluster's view); None checks this process.
    """
    if gpu is None:
        import torch

        gpu = torch.cuda.is_available()
    return "nccl" if gpu else "memory"


def create_transport(name: str, config: TelescopeConfig | None) -> WeightTransport:
    """Instantiate the weight transport registered under ``name`` (``auto`` resolved here)."""
    from telescope.plugins.manager import get_plugin_manager
    from telescope.plugins.registry import PluginKind

    if name == "auto":
        name = default_transport_name()
    cls = get_plugin_manager().registry.get(PluginKind.WEIGHT_TRANSPORT, name)
    transport: WeightTransport = cls(config)
    return transport
