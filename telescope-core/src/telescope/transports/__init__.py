"""Weight transports: trainer weights to inference servers, in place.

``memory`` (:mod:`.memory`, shared memory on one machine, the CPU default) and
``nccl`` (:mod:`.nccl`, broadcast from trainer rank 0, the GPU and multi-node default); the
protocol is described in :mod:`telescope.api.transport`. This package imports
nothing heavy until a transport is created.
"""

from __future__ import annotations


def default_transport_name(gpu: bool | None = None, multi_node: bool = False) -> str:
    """What ``weight_transport: auto`` means: ``nccl`` when CUDA is usable or the sender and its
    receivers are on different nodes (``nccl`` runs over gloo without CUDA), else ``memory``.

    ``gpu`` says whether the workers will have GPUs (a Ray cluster's view); None checks this process.
    ``multi_node``: whether the run placed trainer rank 0 and some server on different nodes
    (``memory`` needs one machine).
    """
    if gpu is None:
        import torch

        gpu = torch.cuda.is_available()
    return "nccl" if gpu or multi_node else "memory"
