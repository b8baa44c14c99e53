"""An eval keeps at most ``per_server_limit`` rollouts in flight on each server (issue 16).

A counting fake server records, per server, how many requests are in flight at once;
``telescope eval`` passes ``max_concurrent_samples_per_server`` as the limit, a run
``max_concurrent_prompts_per_server``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.evals import EvalRunner
from telescope.orchestrator.rollouts import Generation
from telescope.orchestrator.services import SamplingSettings

from .fakes import loop_config, plugins_for
from .test_orchestrator import registry_with_parity


@dataclass
class CountingServers:
    """Fake servers that answer after a short wait and count the requests in flight on each."""

    servers: int
    delay_s: float = 0.005
    #: a slower server (its rollouts pile up if the bound were shared by all servers)
    server_delay_s: dict[int, float] = field(default_factory=dict)
    in_flight: Counter[int] = field(default_factory=Counter)
    peak: Counter[int] = field(default_factory=Counter)
    served: Counter[int] = field(default_factory=Counter)

    @property
    def num_servers(self) -> int:
        return self.servers

    async def generate(
        self, server: int, prompt_ids: list[int], max_tokens: int, *, seed: int, priority: int,
        sampling: SamplingSettings,
    ) -> Generation:  # fmt: skip
        self.in_flight[server] += 1
        self.peak[server] = max(self.peak[server], self.in_flight[server])
        try:
            await asyncio.sleep(self.server_delay_s.get(server, self.delay_s))
        finally:
            self.in_flight[server] -= 1
        self.served[server] += 1
        return Generation([40, 41, 2], [-1.0] * 3, "stop", 0, 0)


class Sink:
    def __init__(self) -> None:
        self.logged: list[tuple[str, int]] = []

    def log_eval(self, name: str, step: int, metrics: dict[str, Any], **extra: Any) -> None:
        self.logged.append((name, step))


@pytest.mark.parametrize("limit", [1, 3])
def test_each_server_holds_at_most_the_limit(tmp_path: Path, limit: int) -> None:
    config = loop_config(
        tmp_path, evals=[{"name": "parity", "num_samples": 12, "pass_k": {"k": [1], "n": 2}}],
        max_concurrent_prompts_per_server=32,
    )  # fmt: skip
    servers = CountingServers(servers=2, delay_s=0.001, server_delay_s={1: 0.03})
    renderer = ChatRenderer(build_tokenizer(PRESETS["test"]))
    runner = EvalRunner(config, plugins_for(registry_with_parity()), renderer, servers, Sink(), per_server_limit=limit)
    metrics = asyncio.run(runner.run_all(step=7, servers=[0, 1], phase="standalone"))
    assert metrics["parity"]["eval/parity/num_items"] == 12
    assert servers.served == Counter({0: 12, 1: 12})  # 24 rollouts, round robin
    assert servers.peak == Counter({0: limit, 1: limit})  # the bound is reached and never passed


def test_a_run_bounds_its_evals_with_max_concurrent_prompts_per_server(tmp_path: Path) -> None:
    config = loop_config(tmp_path, evals=[{"name": "parity", "num_samples": 10}], max_concurrent_prompts_per_server=2)
    servers = CountingServers(servers=1)
    renderer = ChatRenderer(build_tokenizer(PRESETS["test"]))
    runner = EvalRunner(config, plugins_for(registry_with_parity()), renderer, servers, Sink())
    assert runner.per_server_limit == 2
    asyncio.run(runner.run_all(step=0, servers=[0], phase="before"))
    assert servers.peak == Counter({0: 2})
