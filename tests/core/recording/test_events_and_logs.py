"""The event bus's context and publishing, worker events, the sandboxes' log and a worker's process logs."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from telescope.api import events
from telescope.recording.run_logs import SandboxLog, capture_process_logs


@pytest.fixture
def captured() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    unsubscribe = events.subscribe(seen.append)
    yield seen
    unsubscribe()


def test_context_ids_reach_events_in_tasks_and_worker_threads(captured: list[dict[str, Any]]) -> None:
    def in_thread() -> None:
        events.emit("tool.call", tool="add")

    async def rollout(index: int) -> None:
        with events.context(group_id=7, rollout_index=index):
            with events.context(turn=0):
                events.emit("inference.request", server=1)
                await asyncio.to_thread(in_thread)
            events.emit("reward.compute", rollout_index=99)  # an explicit field wins

    async def scenario() -> None:
        await asyncio.gather(rollout(0), rollout(1))
        events.emit("orchestrator.step")  # outside every context

    asyncio.run(scenario())
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for event in captured:
        by_kind.setdefault(event["kind"], []).append(event)
    assert sorted(e["rollout_index"] for e in by_kind["inference.request"]) == [0, 1]
    assert all(e["group_id"] == 7 and e["turn"] == 0 for e in by_kind["inference.request"] + by_kind["tool.call"])
    assert sorted(e["rollout_index"] for e in by_kind["tool.call"]) == [0, 1]
    assert [e["rollout_index"] for e in by_kind["reward.compute"]] == [99, 99]
    assert all("turn" not in e for e in by_kind["reward.compute"])
    assert "group_id" not in by_kind["orchestrator.step"][0]


def test_publish_hands_a_remote_event_over_as_it_is(captured: list[dict[str, Any]]) -> None:
    from telescope.api.events import publish_worker_events

    with events.context(step=5, group_id=2):
        events.publish({"kind": "trainer.forward", "start": 1.0, "duration_s": 0.5})  # as it is: no context
        publish_worker_events([{"kind": "weights.send", "start": 2.0, "duration_s": 0.25, "group_id": 9}], rank=0)
        publish_worker_events(
            [{"kind": "trainer.backward", "start": 3.0, "duration_s": 0.25, "microbatch": 3}],
            component="trainer",
            rank=1,
            step=4,
        )
    assert captured == [
        {"kind": "trainer.forward", "start": 1.0, "duration_s": 0.5},
        {"step": 5, "group_id": 9, "kind": "weights.send", "start": 2.0, "duration_s": 0.25, "rank": 0},
        {
            "step": 4,
            "group_id": 2,
            "kind": "trainer.backward",
            "start": 3.0,
            "duration_s": 0.25,
            "microbatch": 3,
            "component": "trainer",
            "rank": 1,
        },
    ]


def test_sandbox_log_writes_sandbox_events_only(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "sandboxes.log"
    log = SandboxLog(path)
    log({"kind": "inference.request", "start": 1.0, "duration_s": 1.0})
    assert not path.exists()  # created with the first sandbox event
    log(
        {
            "kind": "sandbox.execute",
            "start": 1.0,
            "duration_s": 0.25,
            "sandbox_id": "sb-1",
            "sample_id": "q3",
            "exit_code": 2,
            "command": "python3 x.py",
            "stdout": "hello\n",
            "stderr": "Traceback\nError: boom",
        }
    )
    log({"kind": "sandbox.create", "start": 2.0, "duration_s": 0.1, "error": "SandboxError: no room"})
    log.close()
    log({"kind": "sandbox.destroy", "start": 3.0, "duration_s": 0.0, "sandbox_id": "sb-1"})  # after close: ignored
    lines = path.read_text().splitlines()
    assert "sandbox.execute sandbox=sb-1 sample_id=q3 exit_code=2 0.250s" in lines[0]
    assert lines[1:6] == ["    $ python3 x.py", "    [stdout]", "    hello", "    [stderr]", "    Traceback"]
    assert lines[6] == "    Error: boom"
    assert "sandbox.create sandbox=- 0.100s error=SandboxError: no room" in lines[7]
    assert len(lines) == 8


def test_a_process_log_holds_logging_and_printed_output(tmp_path: Path) -> None:
    original = sys.stdout, sys.stderr
    undo = capture_process_logs(tmp_path, "trainer_0")
    try:
        logging.getLogger("telescope.trainer").info("step 3 done")
        logging.getLogger("telescope.trainer").debug("a detail")
        print("printed by the backend")
        print("a warning on stderr", file=sys.stderr)
    finally:
        undo()
    assert (sys.stdout, sys.stderr) == original
    main = (tmp_path / "logs" / "trainer_0.log").read_text()
    detailed = (tmp_path / "logs" / "detailed" / "trainer_0.log").read_text()
    console = (tmp_path / "logs" / "stdout" / "trainer_0.log").read_text()
    assert "INFO telescope.trainer: step 3 done" in main and "a detail" not in main
    assert "printed by the backend" not in main and "step 3 done" not in console
    assert console.splitlines() == ["printed by the backend", "a warning on stderr"]
    assert "DEBUG telescope.trainer: a detail" in detailed and "step 3 done" in detailed
    logging.getLogger("telescope.trainer").info("after undo")
    assert "after undo" not in (tmp_path / "logs" / "trainer_0.log").read_text()
    print("printed after undo")
    assert "after undo" not in (tmp_path / "logs" / "stdout" / "trainer_0.log").read_text()


def test_a_server_whose_console_its_parent_keeps_is_not_teed(tmp_path: Path) -> None:
    original = sys.stdout, sys.stderr
    undo = capture_process_logs(tmp_path, "inference_0", tee_streams=False, main_level=logging.DEBUG)
    try:
        assert (sys.stdout, sys.stderr) == original
        logging.getLogger("telescope.inference").debug("engine step")
    finally:
        undo()
    assert "DEBUG telescope.inference: engine step" in (tmp_path / "logs" / "inference_0.log").read_text()
    assert not (tmp_path / "logs" / "stdout" / "inference_0.log").exists()
