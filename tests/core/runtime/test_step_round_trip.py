"""A training step is one round trip to the trainer ranks: the metrics and the timeline records come back together.

The ranks are fakes of the Ray actor handles (``actor.method.remote(...)`` returns an awaitable),
so the test counts every call the driver makes to them during a step.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from telescope.api import events
from telescope.api.records import TrainingBatch
from telescope.runtime.ray_services import RayServices
from telescope.runtime.workers import TrainStepResult
from telescope.schema.config import TelescopeConfig


class FakeRank:
    """An actor handle whose every remote call is recorded; ``train_step`` answers like a worker."""

    def __init__(self, rank: int, calls: list[tuple[int, str]]) -> None:
        self.rank = rank
        self.calls = calls

    def __getattr__(self, method: str) -> Any:
        rank, calls = self.rank, self.calls

        class Method:
            @staticmethod
            def remote(*args: Any) -> Any:
                calls.append((rank, method))

                async def answer() -> Any:
                    if method == "train_step":
                        phase = {"kind": "trainer.forward", "ts": 1.0, "duration": 0.5, "microbatch": 0}
                        return TrainStepResult(metrics={"loss": 0.25}, events=[phase])
                    raise AssertionError(f"the driver called {method} during a step")

                return answer()

        return Method()


def test_a_training_step_is_one_call_per_rank_with_its_events(tmp_path: Path) -> None:
    config = TelescopeConfig.model_validate({"environments": [{"name": "countdown"}]})
    services = RayServices(config, tmp_path)
    calls: list[tuple[int, str]] = []
    services.trainers = [FakeRank(0, calls), FakeRank(1, calls)]
    published: list[dict[str, Any]] = []
    unsubscribe = events.subscribe(published.append)
    try:
        metrics = asyncio.run(services.train_step(TrainingBatch(samples=[], step=7)))
    finally:
        unsubscribe()
    assert metrics == {"loss": 0.25}
    assert calls == [(0, "train_step"), (1, "train_step")]  # one round trip: no second call for the events
    phases = [e for e in published if e.get("kind") == "trainer.forward"]
    assert sorted(e["rank"] for e in phases) == [0, 1] and {e["step"] for e in phases} == {7}
