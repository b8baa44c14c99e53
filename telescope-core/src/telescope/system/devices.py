"""Which GPUs a worker uses: the ones Ray assigned it, never indices into a global list.

Ray gives each actor that asks for ``num_gpus`` a set of accelerator ids
(``ray.get_runtime_context().get_accelerator_ids()["GPU"]``, e.g. ``["2", "3"]``)
and narrows the actor's ``CUDA_VISIBLE_DEVICES`` to exactly those ids (unless
``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` is set, when the actor sees every
device of its node). The ids are the values to put in ``CUDA_VISIBLE_DEVICES``
(Ray takes them from the node's own ``CUDA_VISIBLE_DEVICES`` when the node was
started with one). So:

- an inference server process (vLLM, the embedded engine) gets
  ``CUDA_VISIBLE_DEVICES`` = its worker's assigned ids (:func:`worker_visible_devices`),
  and a vLLM server with tensor parallelism ``tp`` has exactly ``tp`` of them;
- a trainer rank uses the CUDA device that is its assigned id
  (:func:`local_cuda_index`: its position in the process's visible devices, index 0
  when Ray narrowed them);
- without a scheduler (``telescope eval``, a test), worker ``i`` takes the ``i``-th
  share of the visible devices, as before.

Everything here but :func:`ray_gpu_ids` is a pure function of its arguments, so the
assignments Ray makes (2 workers x TP 1, 1 x TP 2, 2 x TP 2, several nodes) are
tested on a CPU.
"""

from __future__ import annotations

from collections.abc import Sequence


def parse_visible(value: str | None) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as a list (None when unset: every device is visible)."""
    if value is None:
        return None
    return [d.strip() for d in value.split(",") if d.strip()]


def ray_gpu_ids() -> tuple[str, ...] | None:
    """The GPU ids Ray assigned the current actor or task; None outside Ray or without GPUs."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        ids = ray.get_runtime_context().get_accelerator_ids().get("GPU") or []
    except Exception:
        return None
    return tuple(str(i) for i in ids) or None


def worker_visible_devices(
    assigned: Sequence[str] | None, visible: str | None, worker_index: int, count: int
) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` of inference worker ``worker_index``'s server process.

    ``assigned``: the ids Ray gave the worker (they are its devices, whatever its
    index: Ray already chose them); their number must be ``count`` (the
    tensor-parallel size). Without an assignment, the worker's share ``i * count ..
    (i + 1) * count - 1`` of ``visible`` (the process's ``CUDA_VISIBLE_DEVICES``, or
    devices ``0..`` when unset). Returns the value to set; raises ``ValueError``
    with what to change when the devices do not fit.
    """
    if assigned:
        if len(assigned) != count:
            raise ValueError(
                f"inference worker {worker_index} was assigned {len(assigned)} GPUs ({','.join(assigned)}) but "
                f"needs inference_tensor_parallel_size={count}"
            )
        return ",".join(assigned)
    devices = parse_visible(visible)
    wanted = range(worker_index * count, (worker_index + 1) * count)
    if devices is None:
        return ",".join(str(d) for d in wanted)
    if len(devices) < wanted.stop:
        raise ValueError(
            f"inference worker {worker_index} needs GPUs {wanted.start}..{wanted.stop - 1} "
            f"(inference_tensor_parallel_size={count}) but CUDA_VISIBLE_DEVICES lists {len(devices)}"
        )
    return ",".join(devices[i] for i in wanted)


def local_cuda_index(assigned: Sequence[str] | None, visible: str | None) -> int | None:
    """The CUDA device index (within this process) of the one GPU assigned to a trainer rank.

    Its position in ``visible`` (``CUDA_VISIBLE_DEVICES``; 0 when Ray narrowed it to
    the assigned id), or the id itself when nothing is hidden. None without an
    assignment (the backend's own choice then holds: ``LOCAL_RANK`` or the rank).
    """
    if not assigned:
        return None
    if len(assigned) != 1:
        raise ValueError(f"a trainer rank uses one GPU; Ray assigned {len(assigned)} ({','.join(assigned)})")
    device = str(assigned[0])
    devices = parse_visible(visible)
    if devices is None:
        return int(device)
    if device not in devices:
        raise ValueError(f"the GPU Ray assigned ({device}) is not among CUDA_VISIBLE_DEVICES={visible}")
    return devices.index(device)


def embedded_device(assigned: Sequence[str] | None, worker_index: int, device_count: int) -> str:
    """The torch device of an embedded-engine server process.

    With an assignment its process sees only the assigned GPUs (first one: ``cuda:0``);
    without one, worker ``i`` takes visible device ``i mod count``; no GPU: ``cpu``.
    """
    if assigned:
        return "cuda:0"
    if device_count <= 0:
        return "cpu"
    return f"cuda:{worker_index % device_count}"
