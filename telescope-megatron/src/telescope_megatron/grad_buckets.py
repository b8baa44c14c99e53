"""Data-parallel gradient reduction in flat buckets, optionally overlapped with the backward.

Design (the idea of megatron-core's DDP buckets, without its contiguous gradient buffer):

- **layout** (:func:`plan_buckets`, fixed at setup): the parameters, in *reverse* order of
  registration (about the order in which the backward finishes them), are packed into
  buckets of at most ``max_elements`` elements each (:data:`BUCKET_ELEMENTS`, megatron-core's
  default of 40M, unless the backend is given another), one bucket per reduction group and
  gradient dtype at a time; a parameter larger than the limit gets a bucket of its own.
  The dense weights reduce over the data- x context-parallel group, a MoE model's experts
  over the expert-data-parallel group; both are divided by the data-parallel size.
- **reduction** (:meth:`GradReducer.finish`): each bucket's gradient buffers
  (:class:`~telescope_megatron.precision.MainParameters`' accumulated gradients, in their
  dtype: float32 with ``megatron_grad_reduce_in_fp32``) are copied into one flat tensor,
  summed with one ``all_reduce``, divided, and copied back. A parameter with no gradient on
  this rank contributes zeros and gets the reduced gradient (every rank then steps it alike).
- **overlap** (``megatron_overlap_grad_reduce``): the backend arms the reducer before the
  last micro-batch of a minibatch (:meth:`GradReducer.arm`; under pipeline parallelism
  before the schedule, counting one accumulation per micro-batch); a hook after each
  parameter's gradient accumulation marks it ready, and once every parameter of a bucket is ready the
  bucket is packed and its ``all_reduce`` launched asynchronously, while the backward goes
  on. Buckets are launched strictly in layout order (a ready bucket waits for the ones
  before it), so every rank issues the same collectives in the same order whatever the
  order its backward finishes parameters in. :meth:`GradReducer.finish` launches what the
  backward did not, waits for all, then unpacks. Each flat tensor and its work handle are
  kept until the wait; the gradient buffers themselves are only read at launch and written
  at the unpack, so the gradients seen before :meth:`~GradReducer.finish` are the local
  ones, as without overlap. This needs each parameter's gradient accumulated once per
  armed backward (true of the models built here, recomputation included): an accumulation
  after its bucket started is an error, not a silently stale sum. A parameter that gets no
  gradient in an armed backward (an expert no token reached) only delays its bucket, and
  the ones after it, to :meth:`~GradReducer.finish`.

Limits: packing copies each bucket (one bucket of extra memory at a time without overlap,
all launched buckets with it), where megatron-core's gradients are views of the flat buffer;
the tensor-parallel partial sums and the tied embedding's sum over the embedding group stay
one ``all_reduce`` per parameter (a few small tensors: the norms, one embedding), in the
backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from telescope_megatron.precision import MainParameters

#: Elements per bucket (megatron-core's DDP default ``bucket_size``: 40M).
BUCKET_ELEMENTS = 40_000_000


@dataclass(frozen=True)
class Bucket:
    """Parameters reduced together: their names (in packing order), their group and their gradient dtype."""

    names: tuple[str, ...]
    group: Any
    dtype: torch.dtype


def plan_buckets(
    params: list[tuple[str, int, torch.dtype, Any]], max_elements: int
) -> list[tuple[tuple[str, ...], torch.dtype, Any]]:
    """Buckets of ``(name, numel, dtype, group key)`` in the given order, at most ``max_elements`` elements each.

    One open bucket per (dtype, group key); a parameter that does not fit closes it. The
    buckets come in the order they were opened (their first parameter's position).
    """
    if max_elements < 1:
        raise ValueError(f"bucket size must be at least 1 element, got {max_elements}")
    opened: list[tuple[list[str], torch.dtype, Any]] = []
    open_: dict[tuple[torch.dtype, Any], tuple[list[str], int]] = {}  # key -> (names, index in opened)
    sizes: dict[int, int] = {}
    for name, numel, dtype, key in params:
        current = open_.get((dtype, key))
        if current is None or sizes[current[1]] + numel > max_elements:
            names: list[str] = []
            opened.append((names, dtype, key))
            current = open_[(dtype, key)] = (names, len(opened) - 1)
            sizes[current[1]] = 0
        current[0].append(name)
        sizes[current[1]] += numel
    return [(tuple(names), dtype, key) for names, dtype, key in opened]


@dataclass
class _InFlight:
    """A launched bucket: its flat tensor and work handle, both held until the wait."""

    flat: torch.Tensor
    work: Any


class GradReducer:
    """Sums the gradient buffers over their data-parallel groups in buckets and divides by ``divisor``.

    ``groups`` maps each parameter name to its process group (the data- x context-parallel
    group, or the expert-data-parallel one), in the order to pack them (reverse registration).
    With ``overlap`` a hook on each model parameter launches a bucket's reduction during the
    armed backward (see the module docstring).
    """

    def __init__(
        self,
        main: MainParameters,
        groups: dict[str, Any],
        divisor: int,
        *,
        max_elements: int = BUCKET_ELEMENTS,
        overlap: bool = False,
    ) -> None:
        self.main = main
        self.divisor = divisor
        self.overlap = overlap
        dtype = main.precision.grad_buffer
        keys = {id(group): group for group in groups.values()}
        plan = plan_buckets(
            [(n, main.model[n].numel(), dtype, id(g)) for n, g in groups.items()],
            max_elements,
        )
        self.buckets = [Bucket(names, keys[key], dt) for names, dt, key in plan]
        self._bucket_of = {name: i for i, bucket in enumerate(self.buckets) for name in bucket.names}
        self._sizes = {id(g): dist.get_world_size(g) for g in keys.values()}
        self._armed = False
        self._ready: set[str] = set()
        self._counts: dict[str, int] = {}
        self._expected = 1
        self._next = 0  # the first bucket not launched yet
        self._in_flight: dict[int, _InFlight] = {}
        #: Buckets whose all_reduce the backward launched (from the hooks) in the last reduction.
        self.launched_during_backward = 0
        self._launched_by_hooks = 0
        self._hooks = []
        if overlap:
            for name in groups:
                self._hooks.append(main.model[name].register_post_accumulate_grad_hook(self._ready_hook(name)))

    # ------------------------------------------------------------- overlap

    def arm(self, backwards: int = 1) -> None:
        """The next ``backwards`` backwards end the minibatch: launch each bucket as its gradients are complete.

        A parameter is complete once its gradient was accumulated ``backwards`` times (one
        per micro-batch of a pipeline schedule; 1 before the last micro-batch otherwise).
        """
        self.discard()
        self._armed = self.overlap
        self._expected = backwards

    def disarm(self) -> None:
        """The next backward is not the last of the minibatch: launch nothing."""
        self.discard()

    def _ready_hook(self, name: str) -> Callable[[torch.Tensor], None]:
        def ready(_: torch.Tensor) -> None:
            if not self._armed:
                return
            if self._bucket_of[name] < self._next:
                raise RuntimeError(
                    f"the gradient of {name} was accumulated again after its bucket's reduction started: "
                    "megatron_overlap_grad_reduce needs one accumulation per parameter in a backward"
                )
            self._counts[name] = self._counts.get(name, 0) + 1
            if self._counts[name] < self._expected:
                return
            self._ready.add(name)
            while self._next < len(self.buckets) and all(n in self._ready for n in self.buckets[self._next].names):
                if self._launch(self._next):
                    self._launched_by_hooks += 1
                self._next += 1

        return ready

    # ----------------------------------------------------------- reduction

    def _communicates(self, bucket: Bucket) -> bool:
        return self._sizes[id(bucket.group)] > 1

    @torch.no_grad()
    def _launch(self, index: int) -> bool:
        """Pack bucket ``index`` and start its all_reduce (nothing where its group is one rank); whether it did."""
        bucket = self.buckets[index]
        if not self._communicates(bucket):
            return False
        parts = []
        for name in bucket.names:
            grad = self.main.accumulated(name)
            parts.append(
                grad.reshape(-1).to(bucket.dtype)
                if grad is not None
                else torch.zeros(self.main.model[name].numel(), dtype=bucket.dtype, device=self.main.model[name].device)
            )
        flat = torch.cat(parts)
        work = dist.all_reduce(flat, group=bucket.group, async_op=True)
        self._in_flight[index] = _InFlight(flat, work)
        return True

    @torch.no_grad()
    def finish(self) -> None:
        """Reduce every bucket (launching those the backward did not), wait, divide, unpack into the buffers."""
        self._armed = False
        self.launched_during_backward = self._launched_by_hooks
        while self._next < len(self.buckets):
            self._launch(self._next)
            self._next += 1
        for index, bucket in enumerate(self.buckets):
            flight = self._in_flight.pop(index, None)
            if flight is None:  # a one-rank group: only the division
                if self.divisor != 1:
                    for name in bucket.names:
                        grad = self.main.accumulated(name)
                        if grad is not None:
                            grad.div_(self.divisor)
                continue
            flight.work.wait()
            flat = flight.flat
            if self.divisor != 1:
                flat.div_(self.divisor)
            offset = 0
            for name in bucket.names:
                buffer = self.main.zero_accumulated(name)
                numel = buffer.numel()
                buffer.copy_(flat[offset : offset + numel].view_as(buffer))
                offset += numel
            del flight, flat
        self._reset()

    def discard(self) -> None:
        """Wait for any launched reduction and drop its result (the buffers keep their local gradients)."""
        self._armed = False
        for flight in self._in_flight.values():
            flight.work.wait()
        self._in_flight.clear()
        self._reset()

    def _reset(self) -> None:
        self._ready.clear()
        self._counts.clear()
        self._next = 0
        self._launched_by_hooks = 0

    def close(self) -> None:
        """Wait for what is in flight and remove the hooks."""
        self.discard()
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
