"""Weight transports: trainer weights to inference servers, in place.

``memory`` (:mod:`.memory`, shared memory on one machine, the CPU default) and
``nccl`` (:mod:`.nccl`, broadcast from trainer rank 0, the GPU default); the
protocol is described in :mod:`telescope.api.transport`. This package imports
nothing heavy until a transport is created.
"""

from __future__ import annotations


def default_transport_name(gpu: bool | None = None) -> str:
    """``nccl`` when CUDA is usable, else ``memory`` (what ``weight_transport: auto`` means).

    ``gpu`` says whether the workers will have GPUs (a Ray cluster's view); None checks this process.
    """
    if gpu is None:
        import torch

        gpu = torch.cuda.is_available()
    return "nccl" if gpu else "memory"
