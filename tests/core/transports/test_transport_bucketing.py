"""Flattened buckets: planning, packing and zero-copy unpacking of mixed-dtype tensors."""

from __future__ import annotations

import torch

from telescope.transports.bucketing import ALIGN, Manifest, pack, plan, unpack


def _weights() -> list[tuple[str, torch.Tensor]]:
    torch.manual_seed(0)
    return [
        ("a.weight", torch.randn(3, 5)),
        ("b.bias", torch.randn(7, dtype=torch.float64)),
        ("c.weight", torch.randn(4, 4).to(torch.bfloat16)),
        ("d.big", torch.randn(100)),
        ("e.int", torch.arange(3, dtype=torch.int64)),
        ("f.half", torch.randn(2, 3).half().t()),  # not contiguous
    ]


def test_plan_respects_bucket_size_and_alignment() -> None:
    weights = _weights()
    manifest = plan(weights, version=3, bucket_bytes=256)
    assert [s.name for s in manifest.tensors] == [n for n, _ in weights]
    assert all(s.offset % ALIGN == 0 for s in manifest.tensors)
    big = next(s for s in manifest.tensors if s.name == "d.big")
    assert big.nbytes == 400 and big.offset == 0, "a tensor larger than a bucket gets its own"
    for bucket, size in enumerate(manifest.bucket_sizes):
        specs = manifest.bucket_specs(bucket)
        assert max(s.offset + s.nbytes for s in specs) <= size
    assert Manifest.from_json(manifest.to_json()) == manifest


def test_pack_unpack_round_trip() -> None:
    weights = _weights()
    manifest = plan(weights, version=1, bucket_bytes=128)
    got: dict[str, torch.Tensor] = {}
    for bucket, size in enumerate(manifest.bucket_sizes):
        specs = manifest.bucket_specs(bucket)
        tensors = [dict(weights)[s.name] for s in specs]
        buffer = pack(tensors, specs, torch.empty(size, dtype=torch.uint8))
        got.update(unpack(buffer, specs))
    for name, tensor in weights:
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor)
