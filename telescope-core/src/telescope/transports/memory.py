"""The in-memory weight transport: one machine, shared memory, the default on CPU.

The sender writes every tensor of a version into one file in ``/dev/shm`` (a
RAM-backed tmpfs; a temporary directory where there is none), laid out by a
:class:`~telescope.transports.bucketing.Manifest`, then publishes the manifest
next to it with an atomic rename. A receiver waits for that manifest, maps the
file copy-on-write and yields zero-copy views of each tensor; loading them into
the model is the one copy on the receiving side. So an update costs one memory
copy to publish and one per receiver to load, whatever the number of receivers.

Why shared memory and not Ray's object store: the inference server is a plain
process (an HTTP server or a vLLM worker), not necessarily a Ray worker, and a
file mapping needs no connection to anything; the cost is the same (Ray's
object store is also shared memory on one machine). Limits: one machine only
(receivers must see the sender's ``/dev/shm``); the sender keeps the latest
version only (older files are unlinked, which stays safe for a receiver still
mapping one), so a receiver asking for a version that was already replaced
gets a clear error; ``/dev/shm`` must hold one copy of the weights.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from telescope.api.transport import WeightTransport
from telescope.transports.bucketing import Manifest, as_bytes, plan, unpack

if TYPE_CHECKING:
    from telescope.api.context import TransportContext
    from telescope.api.settings import PluginSettings

_ONE_BUCKET = 1 << 62


def _shm_parent() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


class MemoryTransport(WeightTransport):
    """Weights through a shared-memory file per version (see the module docstring)."""

    name = "memory"

    def __init__(
        self,
        context: TransportContext | None = None,
        settings: PluginSettings | None = None,
        *,
        root: str | Path | None = None,
        timeout_s: float | None = None,
    ) -> None:
        super().__init__(context, settings)
        self.root = Path(root) if root is not None else None
        self._owns_root = False
        self.timeout_s = timeout_s if timeout_s is not None else self.context.timeout_s
        self._mapping: Any = None
        self.last_send_seconds = 0.0

    # ------------------------------------------------------------------ sender
    def prepare_sender(self, num_receivers: int) -> dict[str, Any]:
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="telescope-weights-", dir=_shm_parent()))
            self._owns_root = True
        self.root.mkdir(parents=True, exist_ok=True)
        return {"transport": self.name, "root": str(self.root)}

    def send(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        if self.root is None:
            self.prepare_sender(0)
        assert self.root is not None
        start = time.perf_counter()
        items = list(weights)
        manifest = plan(items, version, _ONE_BUCKET, mode="memory")
        size = manifest.bucket_sizes[0] if manifest.bucket_sizes else 0
        data_path = self.root / f"v{version}.bin"
        if size:
            mapped = np.memmap(data_path, dtype=np.uint8, mode="w+", shape=(size,))
            buffer = torch.from_numpy(mapped)
            for (_, tensor), spec in zip(items, manifest.tensors, strict=True):
                buffer[spec.offset : spec.offset + spec.nbytes].copy_(as_bytes(tensor))
            mapped.flush()
            del buffer, mapped
        else:
            data_path.touch()
        tmp = self.root / f".v{version}.json.tmp"
        tmp.write_text(manifest.to_json(), encoding="utf-8")
        os.replace(tmp, self.root / f"v{version}.json")
        for old in self.root.glob("v*.json"):
            old_version = int(old.stem[1:])
            if old_version < version:
                old.unlink(missing_ok=True)
                (self.root / f"v{old_version}.bin").unlink(missing_ok=True)
        self.last_send_seconds = time.perf_counter() - start

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

    def receive(self, version: int) -> Iterator[tuple[str, torch.Tensor]]:
        if self.root is None:
            raise RuntimeError("the memory transport receiver is not connected; call connect_receiver first")
        manifest_path = self.root / f"v{version}.json"
        deadline = time.monotonic() + self.timeout_s
        while not manifest_path.exists():
            newer = [int(p.stem[1:]) for p in self.root.glob("v*.json") if int(p.stem[1:]) > version]
            if newer:
                raise RuntimeError(
                    f"weights version {version} was replaced by version {max(newer)} before it "
                    "was received; request the newest version"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"weights version {version} did not appear in {self.root} within "
                    f"{self.timeout_s:.0f} s (ray_broadcast_init_timeout_s)"
                )
            time.sleep(0.002)
        manifest = Manifest.from_json(manifest_path.read_text(encoding="utf-8"))
        if not manifest.tensors:
            return
        mapped = np.memmap(self.root / f"v{version}.bin", dtype=np.uint8, mode="c", shape=(manifest.bucket_sizes[0],))
        buffer = torch.from_numpy(mapped)
        self._mapping = buffer  # keep the mapping alive while the views are in use
        yield from unpack(buffer, manifest.tensors)

    def close(self) -> None:
        self._mapping = None
        if self._owns_root and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self._owns_root = False
