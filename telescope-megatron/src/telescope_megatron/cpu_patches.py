"""The only patches Telescope applies to megatron-core: what it needs to run on a CPU (gloo).

megatron-core assumes CUDA in a few helpers that the CPU path reaches. Each patch
below replaces one helper with a version that does the same thing on the CPU and
calls the original whenever CUDA is available, so on a GPU nothing changes.
:func:`apply_cpu_patches` is idempotent and is called by :func:`telescope_megatron.model.build_model`
before any model exists. Nothing else in the package touches megatron-core internals.

Limits: with the patched RNG helpers there is no separate model-parallel RNG stream
on the CPU; the Telescope configs run with dropout 0, so no random numbers are drawn
inside the layers. Recomputation (``megatron_gradient_checkpointing``) replays the
CPU RNG state, which megatron-core saves itself.

:func:`cuda_free` is a scoped fallback rather than a patch: the pipeline schedules
hard-code CUDA devices in a handful of allocations, so the backend enters it around
the schedule (and the model construction) on the CPU only.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_APPLIED = False


def apply_cpu_patches() -> None:
    """Install the CPU fallbacks (once per process); a no-op for the CUDA code paths."""
    global _APPLIED
    if _APPLIED:
        return
    from megatron.core import utils
    from megatron.core.tensor_parallel import random as mcore_random

    # Why: GlobalMemoryBuffer.get_tensor allocates its scratch buffer (used by the local
    # attention's baddbmm and by the sequence-parallel all-gather) on
    # torch.cuda.current_device(), which raises without CUDA. On the CPU allocate it there.
    original_get_tensor = utils.GlobalMemoryBuffer.get_tensor

    @functools.wraps(original_get_tensor)
    def get_tensor(self: Any, tensor_shape: Any, dtype: torch.dtype, name: str, mem_alloc_context: Any = None) -> Any:
        if torch.cuda.is_available():
            return original_get_tensor(self, tensor_shape, dtype, name, mem_alloc_context)
        numel = 1
        for size in tensor_shape:
            numel *= int(size)
        buffer = self.buffer.get((name, dtype))
        if buffer is None or buffer.numel() < numel:
            buffer = self.buffer[(name, dtype)] = torch.empty(numel, dtype=dtype, requires_grad=False)
        return buffer[:numel].view(*tensor_shape)

    utils.GlobalMemoryBuffer.get_tensor = get_tensor

    # Why: CudaRNGStatesTracker.fork (entered around the attention dropout and the
    # tensor-parallel weight initialisation) and the recomputation checkpoint read and
    # write the CUDA RNG state through these two helpers, which need CUDA. On the CPU
    # there is no CUDA generator: the state is an empty tensor and setting it does nothing.
    original_get_state = mcore_random._get_cuda_rng_state
    original_set_state = mcore_random._set_cuda_rng_state

    @functools.wraps(original_get_state)
    def get_cuda_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
        if torch.cuda.is_available():
            return original_get_state(*args, **kwargs)
        return torch.empty(0, dtype=torch.uint8)

    @functools.wraps(original_set_state)
    def set_cuda_rng_state(*args: Any, **kwargs: Any) -> None:
        if torch.cuda.is_available():
            original_set_state(*args, **kwargs)

    mcore_random._get_cuda_rng_state = get_cuda_rng_state
    mcore_random._set_cuda_rng_state = set_cuda_rng_state

    # Why: CudaRNGStatesTracker.fork switches to the model-parallel CUDA generator, whose
    # state is only ever added through torch.cuda.manual_seed (model_parallel_cuda_manual_seed).
    # On the CPU there is no such generator to switch to: the block runs on the CPU RNG.
    original_fork = mcore_random.CudaRNGStatesTracker.fork

    @contextlib.contextmanager
    def fork(self: Any, name: str = mcore_random._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
        if torch.cuda.is_available():
            with original_fork(self, name):
                yield
        else:
            yield

    mcore_random.CudaRNGStatesTracker.fork = fork
    _APPLIED = True


class _CudaToCpu(TorchFunctionMode):
    """Rewrites ``device="cuda"`` (or a CUDA index) in torch calls to the CPU; ``Tensor.cuda()`` returns the tensor."""

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        device = kwargs.get("device")
        if device is not None and _is_cuda(device):
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


def _is_cuda(device: Any) -> bool:
    if isinstance(device, int):
        return True
    return torch.device(device).type == "cuda"


@contextlib.contextmanager
def cuda_free() -> Iterator[None]:
    """Run a megatron-core block that hard-codes CUDA on the CPU (a no-op when CUDA is available).

    Why: the pipeline schedules and their point-to-point layer (megatron-core 0.16)
    allocate on ``device="cuda"`` / ``torch.cuda.current_device()`` (the token counter,
    the receive buffers, the shape exchange), call ``torch.cuda.synchronize()`` after
    the shape exchange, and ``LanguageModule.setup_embeddings_and_output_layer`` moves
    the tied output weight of the last pipeline stage with ``.cuda()`` before its
    all-reduce. Inside this block those calls land on the CPU: a torch function mode
    rewrites CUDA devices to the CPU and ``Tensor.cuda`` to the identity, and
    ``torch.cuda.current_device`` / ``torch.cuda.synchronize`` are replaced while the
    block runs (restored after). Used only around model construction and the
    pipeline schedule, and only without CUDA.
    """
    if torch.cuda.is_available():
        yield
        return
    saved = torch.cuda.current_device, torch.cuda.synchronize
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.cuda.synchronize = lambda *args, **kwargs: None
    try:
        with _CudaToCpu():
            yield
    finally:
        torch.cuda.current_device, torch.cuda.synchronize = saved
