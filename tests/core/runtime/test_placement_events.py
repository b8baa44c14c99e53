"""``record_placements``: where each worker runs, and its start-up span from its process start to its readiness."""

from __future__ import annotations

from typing import Any

from telescope.api import events
from telescope.runtime.monitoring import record_placements


def test_each_worker_gets_its_placement_and_its_start_up_span() -> None:
    seen: list[dict[str, Any]] = []
    stop = events.subscribe(seen.append)
    try:
        record_placements(
            [
                {
                    "node": "10.0.0.2",
                    "url": "http://10.0.0.2:8100",
                    "gpu_ids": [1],
                    "started_at": 100.0,
                    "ready_at": 109.5,
                }
            ],
            [
                {"node": "10.0.0.1", "gpu_ids": [0], "started_at": 101.0, "ready_at": 110.0},
                {"node": "10.0.0.1", "gpu_ids": [], "started_at": 101.0, "ready_at": None},
            ],  # set-up not done
        )
    finally:
        stop()
    placed = [(e["component"], e.get("server", e.get("rank")), e["node"]) for e in seen if e["kind"] == "worker.placed"]
    assert placed == [("inference", 0, "10.0.0.2"), ("trainer", 0, "10.0.0.1"), ("trainer", 1, "10.0.0.1")]
    startups = [e for e in seen if e["kind"] == "worker.startup"]
    assert [(e["component"], e.get("server", e.get("rank")), e["start"], e["duration_s"]) for e in startups] == [
        ("inference", 0, 100.0, 9.5),
        ("trainer", 0, 101.0, 9.0),
    ]
