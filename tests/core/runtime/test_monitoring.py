"""The runtime's infra collectors over Ray actors, without a cluster (the actors are stand-ins)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import ray

from telescope.recording.infra_monitor import InfraMonitor
from telescope.runtime.monitoring import _drain_collector


class DeadRank:
    """A trainer rank's actor handle whose calls raise what Ray raises for an actor that died."""

    class _Method:
        async def remote(self) -> Any:
            raise ray.exceptions.RayActorError(
                error_msg="The actor died ... (1) the OOM killer due to high memory usage, (2) ray stop ..."
            )

    drain_torch_memory = _Method()


def test_a_dead_worker_is_named_without_rays_guess_at_memory(caplog: pytest.LogCaptureFixture) -> None:
    """A collector whose worker died logs that, not Ray's text (which guesses at an out-of-memory kill)."""
    collector = _drain_collector("torch_memory", 0.5, [DeadRank()], "drain_torch_memory", lambda drained: [])
    monitor = InfraMonitor([collector], lambda event: None)
    with caplog.at_level(logging.WARNING, logger="telescope.recording.infra_monitor"):
        asyncio.run(monitor.collect_once(monitor.collectors[0]))
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "the worker it reads from died" in warning and "high memory usage" not in warning
