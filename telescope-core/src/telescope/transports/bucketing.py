"""Flattened buckets: many tensors of mixed dtypes packed into few byte buffers.

A :class:`Manifest` lists every tensor (name, dtype, shape) and where its bytes
sit: bucket index and byte offset. Buckets hold at most ``bucket_bytes`` (a
larger tensor gets a bucket of its own); offsets are aligned to 64 bytes so that
a slice of a ``uint8`` buffer can be viewed as any dtype without a copy. Both
transports use it: ``memory`` writes one bucket per file region, ``nccl``
broadcasts bucket by bucket (``flattened_bucket``) or sends the manifest and then
tensor by tensor (``per_tensor``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

import torch

ALIGN = 64


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {name!r} in a weight manifest")
    return dtype


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat ``uint8`` view of a tensor's data (contiguous copy first if needed)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]
    bucket: int
    offset: int
    nbytes: int


@dataclass
class Manifest:
    version: int
    mode: str
    tensors: list[TensorSpec] = field(default_factory=list)
    bucket_sizes: list[int] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        raw = json.loads(text)
        specs = [
            TensorSpec(t["name"], t["dtype"], tuple(t["shape"]), t["bucket"], t["offset"], t["nbytes"])
            for t in raw["tensors"]
        ]
        return cls(version=raw["version"], mode=raw["mode"], tensors=specs, bucket_sizes=list(raw["bucket_sizes"]))

    def bucket_specs(self, bucket: int) -> list[TensorSpec]:
        return [t for t in self.tensors if t.bucket == bucket]


def plan(
    weights: Sequence[tuple[str, torch.Tensor]], version: int, bucket_bytes: int, mode: str = "flattened_bucket"
) -> Manifest:
    """Assign each tensor a bucket and an aligned offset, in the given order."""
    if bucket_bytes <= 0:
        raise ValueError("bucket_bytes must be positive")
    manifest = Manifest(version=version, mode=mode)
    bucket, used = 0, 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if used and used + nbytes > bucket_bytes:
            manifest.bucket_sizes.append(used)
            bucket, used = bucket + 1, 0
        manifest.tensors.append(TensorSpec(name, dtype_name(tensor.dtype), tuple(tensor.shape), bucket, used, nbytes))
        used = _aligned(used + nbytes)
    if manifest.tensors:
        manifest.bucket_sizes.append(used)
    return manifest


def pack(weights: Sequence[torch.Tensor], specs: Sequence[TensorSpec], out: torch.Tensor) -> torch.Tensor:
    """Copy each tensor's bytes into ``out`` (a ``uint8`` buffer) at its spec's offset."""
    for tensor, spec in zip(weights, specs, strict=True):
        out[spec.offset : spec.offset + spec.nbytes].copy_(as_bytes(tensor), non_blocking=True)
    return out


def unpack(buffer: torch.Tensor, specs: Sequence[TensorSpec]) -> Iterator[tuple[str, torch.Tensor]]:
    """Views of each tensor inside a packed ``uint8`` buffer (no copy)."""
    for spec in specs:
        raw = buffer[spec.offset : spec.offset + spec.nbytes]
        yield spec.name, raw.view(dtype_from_name(spec.dtype)).view(spec.shape)
