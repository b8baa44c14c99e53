"""The only patches Telescope applies to megatron-core: what it needs to run on a CPU (gloo).

megatron-core assumes CUDA in a few helpers that the CPU path reaches. Each patch
below replaces one helper with a version that does the same thing on the CPU and
calls the original whenever CUDA is available, so on a GPU nothing changes. Two MoE
patches differ (:func:`_patch_moe`): ``te_general_gemm`` is bound to None when
Transformer Engine is absent (a megatron-core NameError on any device), and the
uneven all-gather / reduce-scatter fallback applies to gloo groups (NCCL takes
uneven sizes itself).
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
    _patch_moe()
    _APPLIED = True


def _patch_moe() -> None:
    """The MoE layer's CUDA-only helpers (router weight placement, the all-to-all dispatcher's side stream)."""
    from megatron.core.transformer.moe import moe_utils
    from megatron.core.transformer.moe.router import Router
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    # Why: the router's gating (RouterGatingLinearFunction) tests ``te_general_gemm is not None``
    # to choose Transformer Engine's GEMM, but megatron-core 0.16 binds that name only when
    # Transformer Engine imports, so without it the test raises NameError (CPU or GPU alike).
    # Bound to None it takes its own torch.mm branch, as intended.
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None

    # Why: Router.gating moves a router weight that is on the CPU to
    # torch.cuda.current_device() before every forward (megatron-core builds it on the CPU
    # and expects a GPU). On the CPU there is nowhere to move it: run the gating as is.
    original_gating = Router.gating

    @functools.wraps(original_gating)
    def gating(self: Any, input: torch.Tensor) -> torch.Tensor:
        if torch.cuda.is_available():
            return original_gating(self, input)
        with cuda_free():  # .to(device=current_device()) is then .to("cpu"): the weight stays
            return original_gating(self, input)

    Router.gating = gating

    # Why: MoEAlltoAllTokenDispatcher creates a torch.cuda.Stream in its constructor (once,
    # as a class attribute) and copies the per-rank split sizes device-to-host on it,
    # synchronising on a CUDA event. On the CPU the sizes are already on the host: no stream
    # is made, and the copies are the plain conversions the original makes (numpy split sizes).
    original_init = MoEAlltoAllTokenDispatcher.__init__
    original_dtoh = MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize

    @functools.wraps(original_init)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        if not torch.cuda.is_available() and MoEAlltoAllTokenDispatcher.cuda_dtoh_stream is None:
            MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = _NO_STREAM
        original_init(self, *args, **kwargs)

    @functools.wraps(original_dtoh)
    def dtoh(self: Any, point: str, tokens_per_expert: torch.Tensor | None = None) -> torch.Tensor | None:
        if torch.cuda.is_available():
            return original_dtoh(self, point, tokens_per_expert)
        if not self.drop_and_pad and point == self.cuda_dtoh_point:
            for name in ("input_splits", "output_splits", "output_splits_tp"):
                value = getattr(self, name)
                if torch.is_tensor(value):
                    setattr(self, name, value.numpy())
        return tokens_per_expert

    MoEAlltoAllTokenDispatcher.__init__ = init
    MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize = dtoh
    _patch_uneven_collectives()


def _patch_uneven_collectives() -> None:
    """Uneven all-gather and reduce-scatter over gloo (the MoE dispatcher under tensor parallelism)."""
    import torch.distributed as dist
    from megatron.core.tensor_parallel import mappings

    # Why: under tensor x expert parallelism the all-to-all dispatcher gathers the tokens each
    # tensor-parallel rank received (a different count on each) with the list form of
    # all_gather, and scatters the expert outputs back with the list form of reduce_scatter,
    # both with per-rank sizes. NCCL takes uneven sizes; gloo's allgather needs equal ones and
    # gloo has no list reduce_scatter. On a gloo group with split sizes: all-gather rows
    # padded to the longest and cut back; all-reduce the whole tensor and keep this rank's
    # rows (the same sums). Equal splits, and NCCL groups, take megatron-core's own path.
    original_gather = mappings._gather_along_first_dim
    original_scatter = mappings._reduce_scatter_along_first_dim

    def uneven(group: Any, sizes: Any) -> bool:
        return sizes is not None and group.size() > 1 and dist.get_backend(group) == "gloo"

    @functools.wraps(original_gather)
    def gather(
        input_: torch.Tensor, group: Any, output_split_sizes: Any = None, use_global_buffer: bool = False
    ) -> Any:
        if not uneven(group, output_split_sizes):
            return original_gather(input_, group, output_split_sizes, use_global_buffer)
        sizes = [int(n) for n in output_split_sizes]
        if not max(sizes):
            return input_.new_empty((0, *input_.shape[1:]))
        padded = input_.new_zeros((max(sizes), *input_.shape[1:]))
        padded[: input_.shape[0]] = input_
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=group)
        return torch.cat([part[:n] for part, n in zip(parts, sizes, strict=True)])

    @functools.wraps(original_scatter)
    def reduce_scatter(
        input_: torch.Tensor, group: Any, input_split_sizes: Any = None, use_global_buffer: bool = False
    ) -> Any:
        if not uneven(group, input_split_sizes):
            return original_scatter(input_, group, input_split_sizes, use_global_buffer)
        total = input_.contiguous().clone()
        dist.all_reduce(total, group=group)
        return torch.split(total, [int(n) for n in input_split_sizes])[group.rank()].clone()

    mappings._gather_along_first_dim = gather
    mappings._reduce_scatter_along_first_dim = reduce_scatter


#: Stands in for the all-to-all dispatcher's CUDA side stream on the CPU (never used there).
_NO_STREAM = object()


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
