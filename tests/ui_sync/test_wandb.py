"""W&B runs as a second source: the transaction-log reader, an offline run written by
Telescope's W&B logger, and a fake of W&B's public API (everything offline)."""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from telescope_ui_sync.server.app import create_app
from telescope_ui_sync.sync.schema import connect
from telescope_ui_sync.sync.syncer import SyncService
from telescope_ui_sync.sync.wandb_source import HEADER, TransactionLog

pytest.importorskip("wandb")  # the telescope-ui-sync[wandb] extra


def encode(payloads: list[bytes], block: int = 32768) -> bytes:
    """A transaction log of ``payloads`` (LevelDB's log format after W&B's header)."""
    out = bytearray(HEADER)
    for payload in payloads:
        rest, first = payload, True
        while True:
            left = block - len(out) % block
            if left < 7:
                out += b"\0" * left
                continue
            part, rest = rest[: left - 7], rest[left - 7 :]
            kind = (1 if first else 4) if not rest else (2 if first else 3)
            out += struct.pack("<IHB", zlib.crc32(part, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF, len(part), kind)
            out += part
            first = False
            if not rest:
                break
    return bytes(out)


def test_the_transaction_log_gives_whole_records_as_the_file_grows(tmp_path: Path) -> None:
    payloads = [b"a" * 10, b"b" * 70_000, b"c" * 5]  # the second spans three blocks
    data = encode(payloads)
    path = tmp_path / "run-x.wandb"
    log = TransactionLog(path)
    assert log.read() == []  # not there yet
    path.write_bytes(data[:40_000])  # inside the long record
    assert log.read() == [payloads[0]]
    path.write_bytes(data[:-2])  # the last record half written
    assert log.read() == [payloads[1]]
    damaged = bytearray(data)
    damaged[-1] ^= 0xFF  # a checksum that does not match: waits (a record being written)
    path.write_bytes(bytes(damaged))
    assert log.read() == []
    path.write_bytes(data)
    assert log.read() == [payloads[2]] and log.read() == []
    assert TransactionLog(path).read() == payloads  # from the start


def wait_for_exit(folder: Path, timeout_s: float = 60.0) -> None:
    """W&B's service writes the log's last records after ``finish`` returns: wait for the exit record."""
    from wandb.proto import wandb_internal_pb2

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for payload in TransactionLog(next(folder.glob("run-*.wandb"))).read():
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            if record.WhichOneof("record_type") == "exit":
                return
        time.sleep(0.2)
    raise AssertionError("the W&B run's exit record was never written")


def test_an_offline_run_of_the_wandb_logger_is_a_dashboard_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.core.recording.test_wandb_logger import make_config, make_logger

    for variable in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home" / variable.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "elsewhere" / "run"  # only its wandb/ folder is served, as if copied from another machine
    logger = make_logger(make_config(run_dir, number_of_steps=3), run_dir)
    assert logger.active, logger.failure
    logger.log_eval("countdown", 0, {"eval/countdown/reward_mean": 0.5}, phase="before")
    for step in range(3):
        logger.log_event(
            {
                "kind": "inference.request",
                "start": 10.0 + step,
                "duration_s": 0.5,
                "server": 1,
                "sample_id": f"s{step}",
                "finish_reason": "stop",
            }
        )
        logger.log_rollouts(
            step,
            [
                {
                    "step": step,
                    "group_index": g,
                    "sample_id": f"s{g}",
                    "environment": "countdown",
                    "prompt": "2+2?",
                    "completion": f"<answer>{g}</answer>",
                    "reward": float(g),
                    "advantage": g - 0.5,
                    "completion_tokens": 4,
                }
                for g in range(2)
            ],
        )
        logger.log_step(step, {"reward/mean": 0.5 + step, "grad_norm": 1.0})
    logger.close()
    assert logger.failure is None
    folder = next((run_dir / "wandb").glob("offline-run-*"))
    wait_for_exit(folder)

    con = connect(":memory:")
    results = SyncService(con, [run_dir / "wandb"]).sync_all()
    [(rid, result)] = results.items()
    assert result.rows["metrics"] == 3 and result.rows["rollouts"] == 6 and result.rows["events"] == 3
    api = TestClient(create_app(con), base_url="http://localhost")
    [run] = api.get("/api/runs").json()["runs"]
    assert (run["run_id"], run["source"], run["status"], run["number_of_steps"]) == (rid, "wandb", "completed", 3)
    series = api.get("/api/metrics/series", params={"runs": rid, "names": "reward/mean,eval/countdown/reward_mean"})
    by_name = {s["name"]: (s["x"], s["y"]) for s in series.json()["series"]}
    assert by_name == {"reward/mean": ([0, 1, 2], [0.5, 1.5, 2.5]), "eval/countdown/reward_mean": ([0], [0.5])}
    samples = api.get("/api/rollouts", params={"run": rid, "step": 2}).json()["samples"]
    assert [(s["group_index"], s["reward"]) for s in samples] == [(0, 0.0), (1, 1.0)]
    found = api.get("/api/rollouts/search", params={"run": rid, "q": "<answer>1</answer>"}).json()
    assert found["total"] == 3
    timeline = api.get("/api/timeline", params={"run": rid}).json()
    assert [(e["kind"], e["lane"]) for e in timeline["events"]] == [("inference.request", "inference|server 1")] * 3
    summary = api.get(f"/api/runs/{rid}").json()
    assert summary["config"]["wandb_project"] == "telescope-test"
    assert SyncService(con, [run_dir / "wandb"]).sync_all()[rid].total == 0  # resumed: nothing read twice


class FakeRun:
    """What the dashboard uses of a ``wandb.apis.public.Run``."""

    def __init__(self) -> None:
        self.id, self.name, self.state = "abc123", "api-run", "running"
        self.config = {"number_of_steps": 4, "_wandb": {"internal": 1}}
        self.history = [{"_step": s, "_timestamp": 100.0 + s, "reward/mean": 0.1 * s} for s in range(2)]
        self.asked: list[int] = []

    def scan_history(self, min_step: int = 0) -> list[dict[str, Any]]:
        self.asked.append(min_step)
        return [row for row in self.history if row["_step"] >= min_step]


class FakeApi:
    def __init__(self, run: FakeRun) -> None:
        self.run = run
        self.listed: list[tuple[str, Any]] = []

    def runs(self, path: str, filters: Any = None) -> list[FakeRun]:
        self.listed.append((path, filters))
        return [self.run]


def test_runs_of_the_wandb_api_are_dashboard_runs() -> None:
    run = FakeRun()
    api = FakeApi(run)
    con = connect(":memory:")
    service = SyncService(con, [], wandb_api=api, wandb_projects=["team/telescope"])
    [(rid, result)] = service.sync_all().items()
    assert api.listed == [("team/telescope", {"tags": {"$in": ["telescope"]}})]
    assert result.rows["metrics"] == 2
    client = TestClient(create_app(con, service), base_url="http://localhost")
    [listed] = client.get("/api/runs").json()["runs"]
    assert (listed["name"], listed["source"], listed["status"], listed["path"]) == (
        "api-run",
        "wandb",
        "running",
        "wandb:team/telescope/abc123",
    )
    run.history.append({"_step": 2, "_timestamp": 102.0, "reward/mean": 0.2})
    run.state = "finished"
    syncer = next(iter(service.syncers.values()))
    syncer.last_look = 0.0  # as if API_INTERVAL_S had passed
    assert service.sync_all()[rid].rows["metrics"] == 1 and run.asked == [0, 2]  # only what is new
    series = client.get("/api/metrics/series", params={"runs": rid, "names": "reward/mean"}).json()["series"]
    assert series[0]["x"] == [0, 1, 2]
    summary = client.get(f"/api/runs/{rid}").json()
    assert summary["run"]["status"] == "completed" and summary["config"] == {"number_of_steps": 4}
