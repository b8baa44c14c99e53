"""The syncer: incremental, resumable, tolerant of runs being written."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest
from tests.ui_sync.conftest import write_blocks, write_run

from telescope.recording.run_reader import RunReader
from telescope.recording.run_store import RunStore
from telescope_ui_sync.sync.schema import connect
from telescope_ui_sync.sync.syncer import SyncService, discover, run_id_for


def counts(con, run_id: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {
        t: con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [run_id]).fetchone()[0]
        for t in ("metrics", "rollouts", "events", "system_metrics", "evals", "logs")
    }


def test_first_pass_syncs_every_stream_and_a_second_reads_nothing(tmp_path: Path) -> None:
    run = write_run(tmp_path / "runs" / "a")
    con = connect(":memory:")
    service = SyncService(con, [tmp_path / "runs"])
    first = service.sync_all()[run_id_for(run)]
    assert first.rows == {"metrics": 4, "rollouts": 32, "events": 5, "evals": 1, "logs": 2}
    rid = run_id_for(run)
    assert counts(con, rid) == {"metrics": 16, "rollouts": 32, "events": 5, "system_metrics": 1, "evals": 1, "logs": 2}
    assert service.sync_all()[rid].total == 0
    status, step, total = con.execute("SELECT status, step, number_of_steps FROM runs").fetchone()
    assert (status, step, total) == ("completed", 4, 10)


def test_only_appended_records_are_read(tmp_path: Path) -> None:
    run = write_run(tmp_path / "a")
    con = connect(":memory:")
    service = SyncService(con, [run])
    service.sync_all()
    store = RunStore(run)
    store.log_metrics(4, {"reward/mean": 9.0})
    store.close()
    result = service.sync_all()[run_id_for(run)]
    assert result.rows["metrics"] == 1 and result.rows["rollouts"] == 0
    assert con.execute("SELECT value FROM metrics WHERE step = 4").fetchall() == [(9.0,)]


def test_a_restarted_syncer_resumes_without_duplicates(tmp_path: Path) -> None:
    run = write_run(tmp_path / "a")
    db = tmp_path / "ui.duckdb"
    con = connect(db)
    SyncService(con, [run]).sync_all()
    con.close()
    store = RunStore(run)
    store.log_metrics(4, {"reward/mean": 1.0})
    store.log_rollouts(4, [{"group_index": 0, "prompt": "p", "completion": "new", "reward": 1.0}])
    store.close()
    con = connect(db)
    rows = SyncService(con, [run]).sync_all()[run_id_for(run)].rows
    assert rows["metrics"] == 1 and rows["rollouts"] == 1 and rows["events"] == 0 and rows["logs"] == 0
    assert counts(con, run_id_for(run))["rollouts"] == 33
    assert con.execute("SELECT max(seq) FROM rollouts").fetchone()[0] == 32


def test_a_half_written_last_line_waits_and_a_corrupt_line_is_skipped(tmp_path: Path) -> None:
    run = write_run(tmp_path / "a")
    con = connect(":memory:")
    service = SyncService(con, [run])
    service.sync_all()
    metrics = run / "metrics.jsonl"
    with metrics.open("a") as handle:
        handle.write("{not json}\n")
        handle.write('{"step": 7, "time": 1.0, "reward/mean": 0.7')  # still being written
    assert service.sync_all()[run_id_for(run)].rows["metrics"] == 0
    assert con.execute("SELECT skipped_lines FROM runs").fetchone()[0] == 1
    with metrics.open("a") as handle:
        handle.write("}\n")
    assert service.sync_all()[run_id_for(run)].rows["metrics"] == 1
    assert con.execute("SELECT value FROM metrics WHERE step = 7").fetchone()[0] == 0.7


def test_a_corrupt_line_in_an_open_block_is_skipped_and_counted(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "a")
    store.set_status("running", step=0)
    store.log_event({"kind": "trainer.step", "start": 1.0, "duration_s": 1.0})
    store.flush()
    con = connect(":memory:")
    service = SyncService(con, [tmp_path / "a"])
    assert service.sync_all()[run_id_for(tmp_path / "a")].rows["events"] == 1
    tail = next((tmp_path / "a" / "events").glob("tail-*.jsonl"))
    with tail.open("ab") as handle:
        handle.write(b"not json\n")  # a crash's half line, then the writer goes on
    assert service.sync_all()[run_id_for(tmp_path / "a")].rows["events"] == 0
    assert con.execute("SELECT skipped_lines FROM runs").fetchone()[0] == 1
    store.log_event({"kind": "trainer.step", "start": 3.0, "duration_s": 1.0})
    store.close()  # sealed: the block holds the two good events, the cursor continues after the first
    assert service.sync_all()[run_id_for(tmp_path / "a")].rows["events"] == 1
    assert con.execute("SELECT seq, start FROM events ORDER BY seq").fetchall() == [(0, 1.0), (1, 3.0)]


def test_a_file_that_appears_late_is_read_and_a_new_run_is_discovered(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    root.mkdir()
    con = connect(":memory:")
    service = SyncService(con, [root])
    assert service.sync_all() == {}
    store = RunStore(root / "late")
    store.set_status("running", step=0)
    service.sync_all()
    rid = run_id_for(root / "late")
    assert counts(con, rid)["metrics"] == 0
    store.log_metrics(0, {"loss": 1.0})
    store.log_eval("e", 0, {"eval/e/acc": 0.5})
    store.close()
    rows = service.sync_all()[rid].rows
    assert rows["metrics"] == 1 and rows["evals"] == 1


def test_a_replaced_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    run = write_run(tmp_path / "a")
    con = connect(":memory:")
    service = SyncService(con, [run])
    service.sync_all()
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "time": 1.0, "loss": 3.0}) + "\n")
    service.sync_all()
    assert con.execute("SELECT step, name, value FROM metrics").fetchall() == [(0, "loss", 3.0)]


def test_a_step_written_again_replaces_the_old_values(tmp_path: Path) -> None:
    run = write_run(tmp_path / "a")
    con = connect(":memory:")
    service = SyncService(con, [run])
    service.sync_all()
    store = RunStore(run)  # a resumed run writes step 3 again
    store.log_metrics(3, {"reward/mean": 5.0})
    store.close()
    service.sync_all()
    assert con.execute("SELECT name, value FROM metrics WHERE step = 3").fetchall() == [("reward/mean", 5.0)]


def _one(con: duckdb.DuckDBPyConnection, sql: str) -> Any:
    row = con.execute(sql).fetchone()
    assert row is not None
    return row[0]


def _attempt(store: RunStore, steps: range, value: float) -> None:
    for step in steps:
        store.log_metrics(step, {"reward/mean": value})
        store.log_rollouts(step, [{"group_index": 0, "prompt": "p", "completion": f"{value}", "reward": value}])
    store.flush()


def test_only_the_current_attempt_shows_after_a_restart_and_the_abandoned_rows_stay_in_the_run(
    tmp_path: Path,
) -> None:
    run = tmp_path / "a"
    store = RunStore(run)
    store.begin_attempt(0, "start")
    _attempt(store, range(4), 1.0)  # steps 0-3; then the trainer dies, checkpoint 2
    con = connect(":memory:")
    service = SyncService(con, [run])
    service.sync_all()
    assert _one(con, "SELECT count(DISTINCT step) FROM metrics") == 4
    store.begin_attempt(2, "trainer_restart")
    _attempt(store, range(2, 3), 2.0)  # step 2 again: step 3 is not trained again yet
    store.close()
    service.sync_all()
    fresh = connect(":memory:")
    SyncService(fresh, [run]).sync_all()  # a dashboard that sees the run for the first time
    for db in (con, fresh):
        rows = db.execute("SELECT step, name, value FROM metrics ORDER BY step").fetchall()
        assert rows == [(0, "reward/mean", 1.0), (1, "reward/mean", 1.0), (2, "reward/mean", 2.0)]
        rollouts = db.execute("SELECT step, reward FROM rollouts ORDER BY step").fetchall()
        assert rollouts == [(0, 1.0), (1, 1.0), (2, 2.0)]
    every = RunReader(run).metrics(include_abandoned=True)
    assert [(m["step"], m["attempt"]) for m in every] == [(0, 0), (1, 0), (2, 0), (3, 0), (2, 1)]


def test_a_running_run_whose_process_is_gone_shows_died(tmp_path: Path) -> None:
    run = write_run(tmp_path / "a", status="running")
    driver = (
        "import sys, time\nfrom telescope.recording.run_store import RunStore\n"
        "RunStore(sys.argv[1]).set_status('running', step=4)\nprint('up', flush=True)\ntime.sleep(600)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", driver, str(run)], stdout=subprocess.PIPE, text=True)
    con = connect(":memory:")
    service = SyncService(con, [run])
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "up"
        service.sync_all()
        assert _one(con, "SELECT status FROM runs") == "running"
    finally:
        process.kill()  # SIGKILL: status.json is left as it was
        process.wait(timeout=30)
    service.sync_all()
    assert _one(con, "SELECT status FROM runs") == "died"


def test_a_deleted_run_is_marked_missing_and_comes_back(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run = write_run(root / "a")
    con = connect(":memory:")
    service = SyncService(con, [root])
    service.sync_all()
    saved = tmp_path / "saved"
    shutil.move(run, saved)
    service.sync_all()
    assert con.execute("SELECT missing FROM runs").fetchone()[0] is True
    assert counts(con, run_id_for(run))["rollouts"] == 32  # what was synced stays viewable
    shutil.move(saved, run)
    service.sync_all()
    assert con.execute("SELECT missing FROM runs").fetchone()[0] is False


def test_discover_takes_a_run_or_a_folder_of_runs(tmp_path: Path) -> None:
    a = write_run(tmp_path / "runs" / "a", steps=1)
    b = write_run(tmp_path / "runs" / "b", steps=1)
    (tmp_path / "runs" / "not-a-run").mkdir()
    assert [p for p, _ in discover([tmp_path / "runs"])] == [a, b]
    assert discover([a]) == [(a, a)]
    assert discover([tmp_path / "absent"]) == []


def test_the_real_run_syncs_every_stream(real_runs: Path) -> None:
    con = connect(":memory:")
    run = real_runs / "countdown-tiny"
    SyncService(con, [real_runs]).sync_all()
    rid = run_id_for(run)
    got = counts(con, rid)
    steps = con.execute("SELECT count(DISTINCT step) FROM metrics WHERE run_id = ?", [rid]).fetchone()[0]
    assert steps == 3 and got["rollouts"] > 0 and got["evals"] > 0 and got["logs"] > 0
    assert con.execute("SELECT status FROM runs").fetchone()[0] == "completed"


def test_a_truncated_block_is_skipped_named_and_read_again_only_when_it_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "a"
    write_blocks(run, 10)
    block = run / "rollouts" / "block-000003.parquet"
    good = block.read_bytes()
    block.write_bytes(good[: len(good) // 2])
    con = connect(":memory:")
    service = SyncService(con, [run])
    rid = run_id_for(run)
    with caplog.at_level(logging.WARNING, logger="telescope_ui_sync"):
        assert service.sync_all()[rid].rows["rollouts"] == 72  # the other 9 blocks
        bad = con.execute("SELECT stream, file, error FROM bad_blocks WHERE run_id = ?", [rid]).fetchall()
        assert [(stream, file) for stream, file, _ in bad] == [("rollouts", "rollouts/block-000003.parquet")]
        assert bad[0][2]  # the error is kept
        assert service.sync_all()[rid].rows["rollouts"] == 0  # not read again while the file is unchanged
        assert service.sync_all()[rid].rows["rollouts"] == 0
    warnings = [r for r in caplog.records if "block-000003" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert sorted(step for (step,) in con.execute("SELECT DISTINCT step FROM rollouts").fetchall()) == [
        0,
        1,
        2,
        4,
        5,
        6,
        7,
        8,
        9,
    ]
    block.write_bytes(good)  # repaired: read on the next pass
    assert service.sync_all()[rid].rows["rollouts"] == 8
    assert con.execute("SELECT count(*) FROM bad_blocks").fetchone()[0] == 0
    assert counts(con, rid)["rollouts"] == 80
    assert con.execute("SELECT count(DISTINCT seq) FROM rollouts").fetchone()[0] == 80
