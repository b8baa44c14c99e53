"""The orchestrator's event loop: uvloop's when installed, asyncio's otherwise, with asyncio.run's semantics."""

from __future__ import annotations

import asyncio
import sys

import pytest

from telescope.system import event_loop


async def loop_module() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__


def test_runs_on_uvloop_when_it_is_installed() -> None:
    pytest.importorskip("uvloop")
    assert event_loop.run(loop_module()).startswith("uvloop")


def test_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert event_loop.loop_factory() is None
    assert event_loop.run(loop_module()).startswith("asyncio")


def test_an_error_propagates_and_the_loop_is_closed() -> None:
    seen: list[asyncio.AbstractEventLoop] = []

    async def fails() -> None:
        seen.append(asyncio.get_running_loop())
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        event_loop.run(fails())
    assert seen[0].is_closed()
