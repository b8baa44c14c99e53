"""Conformance kit for weight transports: inherit, give a factory, run pytest.

Usage, in a transport package's tests::

    from telescope.testing.transport import WeightTransportConformance

    def make_my_transport():          # module level: receivers are built in other processes
        return MyTransport(TransportContext(timeout_s=30))

    class TestMyTransport(WeightTransportConformance):
        factory = staticmethod(make_my_transport)

Each inherited ``test_*`` checks one part of the contract of
:mod:`telescope.api.transport`, the way a run uses it: the sender in the test
process, every receiver in a process of its own (``spawn``; a collective
transport needs every rank running at once, and a receiver in a real run lives in
another process anyway):

- ``prepare_sender`` returns JSON-able connection info;
- versions sent one after another (each once every receiver has the previous
  one, as a run does) reach every receiver whole, in order, with the same names,
  order, dtypes, shapes and bytes (mixed dtypes, a 0-d tensor, a non-contiguous one);
- ``close`` is safe to call twice.

Set ``num_receivers`` (default 2) for the number of receiving processes and
``timeout_s`` for how long a test waits for them.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from collections.abc import Callable
from typing import Any, ClassVar

from telescope.api.transport import WeightTransport


def reference_weights(version: int) -> list[tuple[str, Any]]:
    """The tensors version ``version`` carries: mixed dtypes and shapes, a 0-d and a non-contiguous one."""
    import torch

    g = torch.Generator().manual_seed(1000 + version)
    return [
        ("model.embed_tokens.weight", torch.randn(32, 8, generator=g)),
        ("model.norm.weight", torch.randn(8, generator=g).to(torch.bfloat16)),
        ("model.layers.0.mlp.up_proj.weight", torch.randn(8, 12, generator=g).t()),  # non-contiguous
        ("model.scale", torch.tensor(float(version))),
        ("model.layers.0.bias", torch.randn(5, generator=g).double()),
    ]


def _receive(
    factory: Callable[[], WeightTransport], info: dict[str, Any], rank: int, versions: list[int], out: Any
) -> None:
    """Receiver process: connect, receive each version, report whether it matched exactly."""
    import torch

    try:
        transport = factory()
        transport.connect_receiver(info, rank, "cpu")
        for version in versions:
            got = [(name, tensor.clone()) for name, tensor in transport.receive(version)]
            expected = reference_weights(version)
            same = [n for n, _ in got] == [n for n, _ in expected] and all(
                a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
                for (_, a), (_, b) in zip(got, expected, strict=True)
            )
            out.put((rank, version, "ok" if same else f"mismatch: got {[(n, t.dtype) for n, t in got]}"))
        transport.close()
    except Exception as exc:  # reported to the test process
        out.put((rank, -1, f"{type(exc).__name__}: {exc}"))


class WeightTransportConformance:
    """Base class of a transport's conformance tests (pytest collects the subclass)."""

    #: A picklable, module-level function returning a fresh transport (sender or receiver).
    factory: ClassVar[Callable[[], WeightTransport]]
    num_receivers: ClassVar[int] = 2
    timeout_s: ClassVar[float] = 120.0

    def _run(self, versions: list[int]) -> None:
        sender = type(self).factory()
        info = sender.prepare_sender(self.num_receivers)
        json.dumps(info)  # JSON-able: it crosses HTTP to the inference servers
        context = mp.get_context("spawn")
        out = context.Queue()
        receivers = [
            context.Process(target=_receive, args=(type(self).factory, info, 1 + r, versions, out))
            for r in range(self.num_receivers)
        ]
        for process in receivers:
            process.start()
        results: list[tuple[int, int, str]] = []
        try:
            for version in versions:  # as a run does: the next version once every server has this one
                sender.send(reference_weights(version), version)
                results += [out.get(timeout=self.timeout_s) for _ in range(self.num_receivers)]
        finally:
            for process in receivers:
                process.join(timeout=self.timeout_s)
                if process.is_alive():
                    process.kill()
            sender.close()
        failures = [r for r in results if r[2] != "ok"]
        assert not failures, f"receivers reported: {failures}"
        for rank in range(1, self.num_receivers + 1):
            assert [v for r, v, _ in results if r == rank] == versions, "versions arrived out of order"

    def test_transport_has_a_name(self) -> None:
        transport = type(self).factory()
        assert isinstance(type(transport).name, str) and type(transport).name
        transport.close()

    def test_every_version_reaches_every_receiver_exactly(self) -> None:
        self._run([0, 1, 2])

    def test_close_twice_is_safe(self) -> None:
        transport = type(self).factory()
        transport.prepare_sender(1)
        transport.close()
        transport.close()


__all__ = ["WeightTransportConformance", "reference_weights"]
