"""Where an episode's requests go: its group's server (affinity) or the least busy one."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.call_routing import CallRouter

from .fakes import FakeServices
from .test_orchestrator import run_loop


def test_the_router_keeps_the_home_server_or_picks_the_least_busy_available_one() -> None:
    up = {0: True, 1: True, 2: False}
    pinned, spread = CallRouter([0, 1, 2], up.__getitem__), CallRouter([0, 1, 2], up.__getitem__, affinity=False)
    spread.in_flight.update({0: 3, 1: 1, 2: 0})
    assert pinned.choose(0) == 0
    assert spread.choose(0) == 1  # 2 has fewer in flight but is unavailable
    spread.in_flight[1] = 3
    assert spread.choose(0) == 0 and spread.choose(1) == 1  # a tie goes to the home server

    async def both() -> list[int]:
        gate = asyncio.Event()

        async def request(server: int) -> int:
            await gate.wait()
            return server

        tasks = [asyncio.ensure_future(spread.call(0, request)) for _ in range(2)]
        await asyncio.sleep(0)
        assert spread.in_flight == {0: 4, 1: 4, 2: 0}  # counted while in flight
        gate.set()
        return list(await asyncio.gather(*tasks))

    assert sorted(asyncio.run(both())) == [0, 1]
    assert spread.in_flight == {0: 3, 1: 3, 2: 0}


@pytest.mark.parametrize("affinity", [True, False])
def test_a_groups_requests_stay_on_its_server_only_with_affinity(tmp_path: Path, affinity: bool) -> None:
    services = FakeServices(delay_s=0.005)
    run_loop(
        tmp_path,
        build_tokenizer(PRESETS["test"]),
        services,
        episode_server_affinity=affinity,
        number_of_steps=2,
        group_size=8,
    )
    servers: dict[Any, set[int]] = defaultdict(set)
    for request in services.requests:
        servers[request["group_id"]].add(request["server"])
    spread = [group for group, used in servers.items() if len(used) > 1]
    assert (not spread) if affinity else spread, dict(servers)
