"""The in-memory weight transport: one machine, shared memory, the default on CPU.

One shared-memory region per run, reused by every version. The sender creates a
file in ``/dev/shm`` (a RAM-backed tmpfs; a temporary directory where there is
none) the first time it sends, sized for two *slots*, each holding every tensor
of one version laid out by a :class:`~telescope.transports.bucketing.Manifest`
(the *layout*, written once next to the region as ``region-<n>.json``). Both sides
map the region once and keep the mapping; a version then costs:

- sender: the slot's header is set to the version (its count of written tensors
  to 0 first), ``current.json`` (a few dozen bytes: version, region, slot) is
  replaced atomically, which publishes the version, then one ``copy_`` of each
  tensor goes straight into its place in the slot (a non-contiguous tensor is
  copied strided, without a contiguous copy first), the count raised after each;
- receiver: waits for ``current.json`` to name the version, then yields a
  zero-copy view of each tensor of the slot as soon as the count says it is
  written; loading them into the model in place
  (:func:`~telescope.inference.weight_updates.load_named_tensors`, a
  ``Tensor.copy_`` per parameter) is the one copy on its side.

The two copies overlap (:attr:`MemoryTransport.streams_while_sent`): the
orchestrator starts the send and the receives together, and a receiver that loads
each tensor as it comes (the embedded engine does, paused) copies tensor ``i``
while the sender writes ``i + 1``, so a version takes about one copy plus the last
tensor's rather than two copies end to end (``bench/bench_weight_sync.py``). This
needs a CPU whose stores reach the other cores in program order (x86-64), so
that a receiver that sees a tensor counted also sees its bytes; elsewhere
(:data:`STREAMS` False) the sender publishes a version once it is all written.

So an update is two memory copies whatever the number of receivers, with no page
faults after the first version (the pages of the region stay mapped on both
sides), no pickling and no file of the weights' size created per version. The
region is replaced (a new ``region-<n+1>``) only when the tensors' names, dtypes
or shapes change.

Why two slots: sends alternate between them, so the views a receiver holds of
version ``v`` stay valid while the sender writes ``v + 1``; they are overwritten
by ``v + 2``. The orchestrator sends ``v + 2`` only after every server has loaded
``v + 1`` (:meth:`~telescope.runtime.ray_services.RayTrainingService.push_weights`
awaits both sides), which is the contract of :mod:`telescope.api.transport`
("valid until the next receive"). As a guard, a receiver checks the slot's version
word before each tensor and after the last, and raises instead of loading a slot
that is being overwritten with a newer version.

Why shared memory and not Ray's object store: the inference server is a plain
process (an HTTP server or a vLLM worker), not necessarily a Ray worker, and a
file mapping needs no connection to anything; Ray's object store is also shared
memory on one machine, but each ``put`` would allocate (and fault in) new pages.

The region's folder (``telescope-weights-p<pid>-<run id>-*``) never outlives the run: its
owner removes it on every exit, the run's driver removes it when the run ends, and the next
sender to start removes the folders of owners that are gone
(:mod:`~telescope.transports.shm_folders`).

Limits: one machine only (receivers must see the sender's ``/dev/shm``);
``/dev/shm`` must hold two copies of the weights (as much as the previous design
held while it replaced one version's file by the next); the latest version only
(a receiver asking for one already replaced gets a clear error); publication
relies on the atomic rename of ``current.json`` (the kernel's locking orders the
sender's writes before the receiver's reads). A sender that stops in the middle of
a version leaves a streaming receiver with part of its tensors (and a
``TimeoutError`` that says how many); the embedded engine then stays paused until
a version loads whole (:meth:`~telescope.inference.embedded.engine.Engine.update_weights`).
A receiver waiting for the sender polls (no cross-process notification is used)
``current.json`` and then the slot's count of written tensors, each wait every 0.1 ms
for its first 10 ms, then every 1 ms (:func:`_poll_interval`).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from telescope.api.transport import WeightTransport
from telescope.transports import shm_folders
from telescope.transports.bucketing import ALIGN, Manifest, TensorSpec, dtype_from_name, plan

if TYPE_CHECKING:
    from telescope.api.context import TransportContext
    from telescope.api.settings import PluginSettings

log = logging.getLogger(__name__)

_ONE_BUCKET = 1 << 62
#: Bytes before a slot's data: two int64 words, the version the slot holds (or is being written with) and how
#: many of its tensors are written so far; padded to the alignment.
_SLOT_HEADER = ALIGN
_EMPTY = -1
_CURRENT = "current.json"
#: Publish a version as soon as its writing starts (receivers take each tensor once it is written)? Only where
#: the CPU makes one core's stores visible to the others in program order (x86-64's total store order), so a
#: receiver that sees a tensor counted also sees its bytes; elsewhere a version is published once written.
STREAMS = platform.machine().lower() in {"x86_64", "amd64"}


#: How a receiver polls, for ``current.json`` to name its version and for the next tensor to be written: every
#: 0.1 ms for the first 10 ms of a wait (the orchestrator starts a receive with its send, so the version is
#: usually named within a few tenths of a millisecond, a tensor within one tensor's copy, and a 1 ms poll was
#: most of a small model's sync), then every 1 ms (a sender that stalls is not polled 10,000 times a second).
_FAST_POLL_S, _FAST_POLL_FOR_S, _SLOW_POLL_S = 0.0001, 0.01, 0.001


def _poll_interval(waited: float) -> float:
    """The sleep before the next look at ``current.json``, ``waited`` seconds into a receive."""
    return _FAST_POLL_S if waited < _FAST_POLL_FOR_S else _SLOW_POLL_S


def _slot_stride(data_bytes: int) -> int:
    return _SLOT_HEADER + (data_bytes + ALIGN - 1) // ALIGN * ALIGN


def _same_layout(a: list[TensorSpec], b: list[TensorSpec]) -> bool:
    return [(t.name, t.dtype, t.shape, t.offset) for t in a] == [(t.name, t.dtype, t.shape, t.offset) for t in b]


def _slot_view(buffer: torch.Tensor, spec: TensorSpec, base: int) -> torch.Tensor:
    """The tensor ``spec`` describes, as a view of the region at slot offset ``base``."""
    raw = buffer[base + spec.offset : base + spec.offset + spec.nbytes]
    return raw.view(dtype_from_name(spec.dtype)).view(spec.shape)


class _Region:
    """One mapped region file: two slots of one layout."""

    def __init__(self, path: Path, layout: Manifest, writable: bool) -> None:
        self.path = path
        self.layout = layout
        self.data_bytes = layout.bucket_sizes[0] if layout.bucket_sizes else 0
        self.stride = _slot_stride(self.data_bytes)
        mode: Literal["r+", "r"] = "r+" if writable else "r"
        mapped = np.memmap(path, dtype=np.uint8, mode=mode, shape=(2 * self.stride,))
        with warnings.catch_warnings():  # a read-only mapping: torch warns that it cannot write to it
            warnings.simplefilter("ignore", UserWarning)
            self.buffer = torch.from_numpy(mapped)
        self._mapped = mapped
        self.words = np.ndarray((2,), dtype=np.int64, buffer=mapped, offset=0, strides=(self.stride,))
        self.written = np.ndarray((2,), dtype=np.int64, buffer=mapped, offset=8, strides=(self.stride,))

    def header(self, slot: int) -> int:
        return int(self.words[slot])

    def base(self, slot: int) -> int:
        return slot * self.stride + _SLOT_HEADER


class MemoryTransport(WeightTransport):
    """Weights through one reused shared-memory region per run (see the module docstring)."""

    name = "memory"
    streams_while_sent = STREAMS

    def __init__(
        self,
        context: TransportContext | None = None,
        settings: PluginSettings | None = None,
        *,
        root: str | Path | None = None,
        parent: str | Path | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """``root``: a folder to use as is (the caller removes it); else the sender creates one under
        ``parent`` (default ``/dev/shm``), which it owns and removes (:mod:`~telescope.transports.shm_folders`)."""
        super().__init__(context, settings)
        self.root = Path(root) if root is not None else None
        self.parent = Path(parent) if parent is not None else None
        self._owns_root = False
        self.timeout_s = timeout_s if timeout_s is not None else self.context.timeout_s
        self._region: _Region | None = None
        self._generation = -1
        self._sends = 0
        self.last_send_seconds = 0.0

    # ------------------------------------------------------------------ sender
    def prepare_sender(self, num_receivers: int) -> dict[str, Any]:
        if self.root is None:
            for orphan in shm_folders.reclaim_orphaned_folders(self.parent):
                log.warning("removed %s: shared memory left by a run that did not close", orphan)
            self.root = shm_folders.create_owned_folder(self.context.run_id, self.parent)
            self._owns_root = True
        self.root.mkdir(parents=True, exist_ok=True)
        return {"transport": self.name, "root": str(self.root)}

    def _sender_region(self, layout: Manifest) -> _Region:
        """The current region if ``layout`` fits it, else a new one (the old file is unlinked)."""
        region = self._region
        if region is not None and _same_layout(region.layout.tensors, layout.tensors):
            return region
        assert self.root is not None
        self._generation += 1
        path = self.root / f"region-{self._generation}.bin"
        stride = _slot_stride(layout.bucket_sizes[0] if layout.bucket_sizes else 0)
        with open(path, "wb") as handle:
            handle.truncate(2 * stride)
        layout_path = self.root / f"region-{self._generation}.json"
        tmp = layout_path.with_suffix(".json.tmp")
        tmp.write_text(layout.to_json(), encoding="utf-8")
        os.replace(tmp, layout_path)
        new = _Region(path, layout, writable=True)
        new.words[:] = _EMPTY
        new.written[:] = 0
        if region is not None:  # receivers still mapping it keep their pages until they remap
            region.path.unlink(missing_ok=True)
            region.path.with_suffix(".json").unlink(missing_ok=True)
        self._region = new
        return new

    def send(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        if self.root is None:
            self.prepare_sender(0)
        assert self.root is not None
        start = time.perf_counter()
        items = list(weights)
        region = self._sender_region(plan(items, version, _ONE_BUCKET, mode="memory"))
        slot = self._sends % 2
        base = region.base(slot)
        region.written[slot] = 0  # first: a receiver of this slot's old version must not count its tensors
        region.words[slot] = version
        if self.streams_while_sent:
            self._publish(version, region, slot)
        with torch.no_grad():
            for count, ((_, tensor), spec) in enumerate(zip(items, region.layout.tensors, strict=True), start=1):
                _slot_view(region.buffer, spec, base).copy_(tensor.detach())
                region.written[slot] = count
        if not self.streams_while_sent:
            self._publish(version, region, slot)
        self._sends += 1
        self.last_send_seconds = time.perf_counter() - start

    def _publish(self, version: int, region: _Region, slot: int) -> None:
        """Name ``version`` in ``current.json`` (atomically replaced): receivers waiting for it start."""
        assert self.root is not None
        tmp = self.root / f".{_CURRENT}.tmp"
        tmp.write_text(json.dumps({"version": version, "region": region.path.stem, "slot": slot}), encoding="utf-8")
        os.replace(tmp, self.root / _CURRENT)

    # ---------------------------------------------------------------- receiver
    def connect_receiver(self, init_info: dict[str, Any], rank: int, device: str = "cpu") -> None:
        if "root" not in init_info:
            raise ValueError(f"memory transport init info lacks 'root': {init_info}")
        self.root = Path(init_info["root"])
        if not self.root.is_dir():
            raise ValueError(
                f"the memory transport's folder {self.root} does not exist here: the sender is on another "
                "machine, and this transport works on one machine only; use weight_transport: nccl (gloo on CPUs)"
            )

    def _published(self, version: int) -> dict[str, Any]:
        """``current.json`` once it names ``version``; raises when it names a newer one or on timeout."""
        assert self.root is not None
        current = self.root / _CURRENT
        began = time.monotonic()
        deadline = began + self.timeout_s
        while True:
            try:
                published: dict[str, Any] = json.loads(current.read_text(encoding="utf-8"))
            except FileNotFoundError:
                published = {"version": None}
            latest = published["version"]
            if latest == version:
                return published
            if latest is not None and latest > version:
                raise RuntimeError(
                    f"weights version {version} was replaced by version {latest} before it "
                    "was received; request the newest version"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"weights version {version} did not appear in {self.root} within "
                    f"{self.timeout_s:.0f} s (ray_broadcast_init_timeout_s)"
                )
            time.sleep(_poll_interval(time.monotonic() - began))

    def _receiver_region(self, name: str) -> _Region:
        if self._region is None or self._region.path.stem != name:
            assert self.root is not None
            layout = Manifest.from_json((self.root / f"{name}.json").read_text(encoding="utf-8"))
            self._region = _Region(self.root / f"{name}.bin", layout, writable=False)
        return self._region

    def receive(self, version: int) -> Iterator[tuple[str, torch.Tensor]]:
        if self.root is None:
            raise RuntimeError("the memory transport receiver is not connected; call connect_receiver first")
        published = self._published(version)
        region = self._receiver_region(str(published["region"]))
        slot = int(published["slot"])
        base = region.base(slot)
        deadline = time.monotonic() + self.timeout_s
        for count, spec in enumerate(region.layout.tensors, start=1):
            self._wait_written(region, slot, version, count, deadline)
            yield spec.name, _slot_view(region.buffer, spec, base)
        self._check_slot(region, slot, version)

    def _wait_written(self, region: _Region, slot: int, version: int, count: int, deadline: float) -> None:
        """Until the sender has written ``count`` tensors of ``version`` (at once where it is complete)."""
        began = time.monotonic()
        while True:
            self._check_slot(region, slot, version)
            written = int(region.written[slot])
            if written >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the sender stopped writing weights version {version} after {written} of "
                    f"{len(region.layout.tensors)} tensors (waited {self.timeout_s:.0f} s, "
                    "ray_broadcast_init_timeout_s)"
                )
            time.sleep(_poll_interval(time.monotonic() - began))

    @staticmethod
    def _check_slot(region: _Region, slot: int, version: int) -> None:
        found = region.header(slot)
        if found != version:
            raise RuntimeError(
                f"weights version {version} was overwritten (slot holds {found}) while being received: the "
                "sender published two newer versions before this receiver finished; send the next version "
                "only after every server has loaded the previous one"
            )

    def close(self) -> None:
        self._region = None
        if self._owns_root and self.root is not None:
            shm_folders.remove_owned_folder(self.root)
            self._owns_root = False
