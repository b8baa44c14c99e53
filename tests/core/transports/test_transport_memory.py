"""The shared-memory transport: publish, receive by version, replacement, region reuse, across processes."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch

from telescope.inference.weight_updates import load_named_tensors
from telescope.transports import memory
from telescope.transports.memory import MemoryTransport


def _weights(scale: float) -> list[tuple[str, torch.Tensor]]:
    return [("w", torch.full((4, 4), scale)), ("b", torch.arange(3, dtype=torch.bfloat16) * scale)]


def test_send_then_receive_and_load() -> None:
    sender = MemoryTransport(None)
    info = sender.prepare_sender(num_receivers=1)
    receiver = MemoryTransport(None, timeout_s=5)
    receiver.connect_receiver(info, rank=1)
    try:
        sender.send(_weights(2.0), version=1)
        got = dict(receiver.receive(1))
        assert torch.equal(got["w"], torch.full((4, 4), 2.0)) and got["b"].dtype == torch.bfloat16
        module = torch.nn.Linear(4, 4, bias=False)
        assert load_named_tensors(module, [("weight", got["w"])]) == 1
        assert torch.equal(module.weight, got["w"])
        sender.send(_weights(3.0), version=2)
        with pytest.raises(RuntimeError, match="replaced by version 2"):
            list(receiver.receive(1))
        # one region for the run, reused: no file created per version
        assert sorted(p.name for p in sender.root.iterdir()) == [  # type: ignore[union-attr]
            "current.json",
            "region-0.bin",
            "region-0.json",
        ]
    finally:
        sender.close()
    assert not sender.root.exists()  # type: ignore[union-attr]


def test_receive_waits_for_the_sender() -> None:
    sender = MemoryTransport(None)
    receiver = MemoryTransport(None, timeout_s=10)
    receiver.connect_receiver(sender.prepare_sender(1), rank=1)
    timer = threading.Timer(0.2, sender.send, args=(_weights(5.0), 4))
    timer.start()
    try:
        got = dict(receiver.receive(4))
        assert float(got["w"][0, 0]) == 5.0
        with pytest.raises(TimeoutError):
            list(MemoryTransport(None, root=sender.root, timeout_s=0.05).receive(9))
    finally:
        timer.join()
        sender.close()


def test_a_waiting_receiver_polls_every_tenth_of_a_millisecond_then_every_millisecond(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fake clock: the receiver waits 20 ms for the version; its first 10 ms of polls are 0.1 ms apart."""
    sender = MemoryTransport(None)
    receiver = MemoryTransport(None, timeout_s=10)
    receiver.connect_receiver(sender.prepare_sender(1), rank=1)
    now = [0.0]
    sleeps: list[float] = []
    sent: list[bool] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds
        if now[0] >= 0.02 and not sent:  # the sender publishes 20 ms into the wait
            sent.append(True)
            sender.send(_weights(3.0), 1)

    fake_time = type(
        "FakeTime",
        (),
        {
            "monotonic": staticmethod(lambda: now[0]),
            "perf_counter": staticmethod(lambda: now[0]),
            "sleep": staticmethod(sleep),
        },
    )
    monkeypatch.setattr(memory, "time", fake_time)
    try:
        got = dict(receiver.receive(1))
        assert float(got["w"][0, 0]) == 3.0
        fast = [s for s in sleeps if s < 0.0005]
        assert 99 <= len(fast) <= 101  # 10 ms at 0.1 ms
        assert sleeps[: len(fast)] == fast  # all before the slower ones
        assert sleeps[len(fast) :] and all(s == 0.001 for s in sleeps[len(fast) :])
    finally:
        sender.close()


def test_the_region_is_reused_and_replaced_only_when_the_layout_changes() -> None:
    sender = MemoryTransport(None)
    receiver = MemoryTransport(None, timeout_s=5)
    receiver.connect_receiver(sender.prepare_sender(1), rank=1)
    try:
        sender.send(_weights(1.0), version=1)
        assert float(dict(receiver.receive(1))["w"][0, 0]) == 1.0
        region = sender.root / "region-0.bin"  # type: ignore[operator]
        inode = region.stat().st_ino
        for version in (2, 3, 4):
            sender.send(_weights(float(version)), version=version)
            got = dict(receiver.receive(version))
            assert torch.equal(got["w"], torch.full((4, 4), float(version)))
            assert torch.equal(got["b"], torch.arange(3, dtype=torch.bfloat16) * version)
        assert region.stat().st_ino == inode  # the same file, written in place
        sender.send([("w", torch.ones(2, 8))], version=5)  # a new layout: a new region, the old one unlinked
        assert torch.equal(dict(receiver.receive(5))["w"], torch.ones(2, 8))
        assert not region.exists() and (sender.root / "region-1.bin").exists()  # type: ignore[operator]
    finally:
        sender.close()


def test_a_slot_overwritten_while_received_is_an_error_not_silent_corruption() -> None:
    sender = MemoryTransport(None)
    receiver = MemoryTransport(None, timeout_s=5)
    receiver.connect_receiver(sender.prepare_sender(1), rank=1)
    try:
        sender.send(_weights(1.0), version=1)
        reading = receiver.receive(1)
        next(reading)
        sender.send(_weights(2.0), version=2)  # the other slot: version 1 stays intact
        sender.send(_weights(3.0), version=3)  # version 1's slot again
        with pytest.raises(RuntimeError, match="overwritten"):
            list(reading)
    finally:
        sender.close()


def test_load_rejects_unknown_names_and_shapes() -> None:
    module = torch.nn.Linear(2, 2)
    with pytest.raises(KeyError, match="no counterpart"):
        load_named_tensors(module, [("nope", torch.zeros(2, 2))])
    with pytest.raises(ValueError, match="shape"):
        load_named_tensors(module, [("weight", torch.zeros(3, 2))])


class _SenderHeldAfterOneTensor:
    """Patches the transport so that a sender in another thread stops after its first tensor until ``go`` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.go = threading.Event()
        self.views = 0
        real = memory._slot_view

        def view(buffer: torch.Tensor, spec: object, base: int) -> torch.Tensor:
            if threading.current_thread() is not threading.main_thread():  # the sender's thread; receivers run in main
                self.views += 1
                if self.views == 2:
                    assert self.go.wait(10)
            return real(buffer, spec, base)  # type: ignore[arg-type]

        monkeypatch.setattr(memory, "_slot_view", view)


@pytest.mark.skipif(not memory.STREAMS, reason="streaming needs x86-64's store order")
def test_a_receiver_takes_each_tensor_while_the_sender_still_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first tensor is received (with its new bytes) while the sender is held before its second."""
    sender = MemoryTransport(None)
    receiver = MemoryTransport(None, timeout_s=10)
    receiver.connect_receiver(sender.prepare_sender(1), rank=1)
    try:
        sender.send(_weights(1.0), version=1)
        assert dict(receiver.receive(1))["b"][2] == 2.0
        held = _SenderHeldAfterOneTensor(monkeypatch)
        sending = threading.Thread(target=sender.send, args=(_weights(3.0), 2))
        sending.start()
        stream = receiver.receive(2)
        name, first = next(stream)
        assert name == "w" and float(first[0, 0]) == 3.0
        assert sending.is_alive()  # the sender has not finished: the receive overlaps the send
        held.go.set()
        name, second = next(stream)
        assert name == "b" and float(second[2]) == 6.0
        assert list(stream) == []
        sending.join()
    finally:
        sender.close()


@pytest.mark.skipif(not memory.STREAMS, reason="streaming needs x86-64's store order")
def test_a_sender_that_stops_part_way_times_the_receiver_out_with_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    sender = MemoryTransport(None)
    receiver = MemoryTransport(None, timeout_s=1.0)  # long enough for a loaded machine to write the first tensor
    receiver.connect_receiver(sender.prepare_sender(1), rank=1)
    held = _SenderHeldAfterOneTensor(monkeypatch)
    sending = threading.Thread(target=sender.send, args=(_weights(3.0), 1))
    sending.start()
    try:
        stream = receiver.receive(1)
        assert next(stream)[0] == "w"
        with pytest.raises(TimeoutError, match="after 1 of 2 tensors"):
            next(stream)
    finally:
        held.go.set()
        sending.join()
        sender.close()


class _WholeVersions(MemoryTransport):
    """The transport as it runs where the CPU's stores may be seen out of order (not x86-64)."""

    streams_while_sent = False


def test_without_streaming_a_version_is_published_once_written(monkeypatch: pytest.MonkeyPatch) -> None:
    sender = _WholeVersions(None)
    receiver = _WholeVersions(None, timeout_s=0.3)
    receiver.connect_receiver(sender.prepare_sender(1), rank=1)
    held = _SenderHeldAfterOneTensor(monkeypatch)
    sending = threading.Thread(target=sender.send, args=(_weights(3.0), 1))
    sending.start()
    try:
        with pytest.raises(TimeoutError, match="did not appear"):  # half written: not published yet
            next(receiver.receive(1))
        held.go.set()
        sending.join()
        got = dict(_WholeVersions(None, root=sender.root, timeout_s=5).receive(1))
        assert float(got["w"][0, 0]) == 3.0 and float(got["b"][2]) == 6.0
    finally:
        held.go.set()
        sending.join()
        sender.close()


@pytest.mark.slow
def test_receiver_in_another_process() -> None:
    sender = MemoryTransport(None)
    info = sender.prepare_sender(1)
    sender.send(_weights(7.0), version=1)
    code = (
        "import sys, torch\n"
        "from telescope.transports.memory import MemoryTransport\n"
        "r = MemoryTransport(None, timeout_s=10); r.connect_receiver({'root': sys.argv[1]}, rank=1)\n"
        "got = dict(r.receive(1)); assert float(got['w'].sum()) == 7.0 * 16, got\n"
        "print('ok')\n"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code, info["root"]], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "ok"
    finally:
        sender.close()
