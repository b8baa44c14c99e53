"""An eval keeps at most ``per_server_limit`` rollouts in flight on each server (issue 16).

The fake services record, per server, how many requests are in flight at once;
``telescope eval`` passes ``max_concurrent_samples_per_server`` as the limit, a run
``max_concurrent_prompts_per_server``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.evals import EvalRunner
from telescope.plugins.registry import PluginKind, Registrar, Registry

from .fakes import FakeServices, ParityEnvironment, loop_config, plugins_for
from .test_orchestrator import registry_with_parity


class Sink:
    def __init__(self) -> None:
        self.logged: list[tuple[str, int]] = []

    def log_eval(self, name: str, step: int, metrics: dict[str, Any], **extra: Any) -> None:
        self.logged.append((name, step))


@pytest.mark.parametrize("limit", [1, 3])
def test_each_server_holds_at_most_the_limit(tmp_path: Path, limit: int) -> None:
    config = loop_config(
        tmp_path,
        evals=[{"name": "parity", "num_samples": 12, "pass_k": {"k": [1], "n": 2}}],
        max_concurrent_prompts_per_server=32,
    )
    servers = FakeServices(servers=2, delay_s=0.001, server_delay_s={1: 0.03})  # rollouts pile up on server 1
    renderer = ChatRenderer(build_tokenizer(PRESETS["test"]))
    runner = EvalRunner(config, plugins_for(registry_with_parity()), renderer, servers, Sink(), per_server_limit=limit)
    metrics = asyncio.run(runner.run_all(step=7, servers=[0, 1], phase="standalone"))
    assert metrics["parity"]["eval/parity/num_items"] == 12
    assert Counter(r["server"] for r in servers.requests) == Counter({0: 12, 1: 12})  # 24 rollouts, round robin
    assert servers.peak_in_flight == Counter({0: limit, 1: limit})  # the bound is reached and never passed


def test_a_run_bounds_its_evals_with_max_concurrent_prompts_per_server(tmp_path: Path) -> None:
    config = loop_config(tmp_path, evals=[{"name": "parity", "num_samples": 10}], max_concurrent_prompts_per_server=2)
    servers = FakeServices(servers=1, delay_s=0.005)
    renderer = ChatRenderer(build_tokenizer(PRESETS["test"]))
    runner = EvalRunner(config, plugins_for(registry_with_parity()), renderer, servers, Sink())
    assert runner.per_server_limit == 2
    asyncio.run(runner.run_all(step=0, servers=[0], phase="before"))
    assert servers.peak_in_flight == Counter({0: 2})


def test_eval_prompts_are_rendered_off_the_event_loop(tmp_path: Path) -> None:
    """A prompt may take a page load to render (miniwob): never on the loop that serves every rollout."""
    rendered_on: list[int] = []

    class Recorded(ParityEnvironment):
        def format_prompt(self, sample: Any) -> list[dict[str, Any]]:
            rendered_on.append(threading.get_ident())
            return super().format_prompt(sample)

    registry = Registry()
    Registrar(registry, PluginKind.ENVIRONMENT, "tests", "tests", "0")("parity", Recorded)
    Registrar(registry, PluginKind.ALGORITHM, "tests", "tests", "0")("grpo", "telescope.algorithms.grpo:GRPO")
    config = loop_config(tmp_path, evals=[{"name": "parity", "num_samples": 6}])
    renderer = ChatRenderer(build_tokenizer(PRESETS["test"]))
    runner = EvalRunner(config, plugins_for(registry), renderer, FakeServices(servers=1, delay_s=0.001), Sink())
    metrics = asyncio.run(runner.run_all(step=0, servers=[0], phase="before"))  # the loop runs on this thread
    assert metrics["parity"]["eval/parity/num_items"] == 6
    assert len(rendered_on) == 6 and threading.get_ident() not in rendered_on
