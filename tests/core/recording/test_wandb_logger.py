"""The W&B logger: an offline run records history, code and logs; failures disable it quietly."""

from __future__ import annotations

import json
import logging
import re
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from telescope.api.context import LoggerContext
from telescope.config.composition import config_from_dict
from telescope.recording.plugin import WandbSettings
from telescope.recording.wandb_logger import (
    INSTALL_HINT,
    WandbLogger,
    code_files,
    log_files,
    wandb_mode,
)
from telescope.schema.config import TelescopeConfig


def make_config(run_dir: Path, **overrides: Any) -> TelescopeConfig:
    values: dict[str, Any] = {
        "environments": [{"name": "countdown"}],
        "run_dir": str(run_dir),
        "wandb_project": "telescope-test",
        "wandb_run_name": "unit",
        "wandb_tags": ["test"],
        "system_metrics_collection_interval_seconds": 30.0,
    }
    values.update(overrides)
    return config_from_dict(values)


def make_logger(config: TelescopeConfig, run_dir: Path) -> WandbLogger:
    """The logger as a run builds it: its own settings and the narrow logger context."""
    return WandbLogger(LoggerContext.from_config(config, str(run_dir)), config.settings(WandbSettings))


@pytest.fixture
def wandb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep W&B's caches and settings inside the test's folder."""
    home = tmp_path / "wandb-home"
    for variable in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(variable, str(home / variable.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return home


def read_wandb_records(run_file: Path, timeout_s: float = 30.0) -> list[Any]:
    """The records of a finished run's file, once W&B's service has written its ``exit`` record.

    ``run.finish()`` can return before the service has flushed the file, so poll.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        records = _decode_wandb_records(run_file)
        if (records and records[-1].WhichOneof("record_type") == "exit") or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def _decode_wandb_records(run_file: Path) -> list[Any]:
    """Decode a ``run-*.wandb`` file: a 7-byte header, then LevelDB-log records of protobufs."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    block, position, pending, records = 32768, 7, b"", []
    while position < len(data):
        if block - position % block < 7:  # block trailer
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        position += 7
        if length == 0 and kind == 0:
            break
        pending += data[position : position + length]
        position += length
        if kind in (1, 4):  # full or last fragment
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_offline_run_records_history_code_and_logs(
    tmp_path: Path, wandb_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")  # the telescope-core[wandb] extra
    monkeypatch.setenv("WANDB_MODE", "offline")
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "small.py").write_text("x = 1\n")
    (project / "pkg" / "big.py").write_text("#" * 3000)  # over the 0.002 MB limit
    (project / "skipme").mkdir()
    (project / "skipme" / "hidden.py").write_text("y = 2\n")
    monkeypatch.chdir(project)
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "trainer.log").write_text("trainer says hi\n")
    config = make_config(run_dir, wandb_code_max_file_size_mb=0.002, wandb_code_exclude_patterns=["skipme", "*.pyc"])
    monkeypatch.setattr(WandbLogger, "max_table_rows", 64)

    logger = make_logger(config, run_dir)
    assert logger.active, logger.failure
    for step in range(3):
        logger.log_step(step, {"reward/mean": 0.25 * step, "skipped": None})
    records = [{"step": 2, "prompt": [{"role": "user", "content": "2+2?"}], "completion": "4" * 10_000, "reward": 1.0}]
    logger.log_rollouts(2, records * 100)
    logger.close()
    logger.close()  # idempotent
    assert logger.failure is None

    run_files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1
    decoded = read_wandb_records(run_files[0])
    history = [
        {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in r.history.item}
        for r in decoded
        if r.WhichOneof("record_type") == "history"
    ]
    kinds = [r.WhichOneof("record_type") for r in decoded]
    assert [(h["_step"], h["reward/mean"]) for h in history] == [(0, 0.0), (1, 0.25), (2, 0.5)], (kinds, history)
    assert "skipped" not in history[0]
    assert history[2]["rollouts_table/nrows"] == WandbLogger.max_table_rows  # bounded
    run_record = next(r.run for r in decoded if r.WhichOneof("record_type") == "run")
    assert run_record.project == "telescope-test" and run_record.display_name == "unit"
    assert list(run_record.tags) == ["test"]
    artifacts = {r.artifact.type: r.artifact for r in decoded if r.WhichOneof("record_type") == "artifact"}
    assert [entry.path for entry in artifacts["code"].manifest.contents] == ["pkg/small.py"]
    assert [entry.path for entry in artifacts["logs"].manifest.contents] == ["logs.tar.gz"]
    assert not list(run_dir.glob(".logs-*"))  # the temporary archive is removed
    table_files = list((run_dir / "wandb").glob("offline-run-*/files/media/table/*.table.json"))
    table = json.loads(table_files[0].read_text())
    assert table["data"][0][4] == "user: 2+2?"
    assert len(table["data"][0][5]) < 4100  # completion clipped


def history_rows(run_dir: Path) -> list[dict[str, Any]]:
    [run_file] = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    return [
        {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in r.history.item}
        for r in read_wandb_records(run_file)
        if r.WhichOneof("record_type") == "history"
    ]


def test_offline_run_mirrors_events_late_evals_snapshot_and_metadata(
    tmp_path: Path, wandb_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")  # the telescope-core[wandb] extra
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    (run_dir / "code" / "pkg").mkdir(parents=True)
    (run_dir / "code" / "pkg" / "snap.py").write_text("z = 3\n")  # the run store's snapshot is what goes up
    (run_dir / "metadata.json").write_text('{"run_name": "unit"}\n')
    monkeypatch.setattr(WandbLogger, "max_table_rows", 2)
    logger = make_logger(make_config(run_dir), run_dir)
    assert logger.active, logger.failure

    logger.log_eval("countdown", 0, {"eval/countdown/reward_mean": 0.5}, phase="before")
    for i in range(3):  # three events before step 0: two tables of at most 2 rows
        logger.log_event(
            {
                "kind": "inference.request",
                "start": 1.0 + i,
                "duration_s": 0.5,
                "server": 0,
                "sample_id": f"q{i}",
                "group_id": i,
                "finish_reason": "stop",
            }
        )
    logger.log_step(0, {"loss": 1.0})
    logger.log_step(1, {"loss": 0.5})
    logger.log_step(2, {"loss": 0.25})
    logger.log_eval("countdown", 1, {"eval/countdown/reward_mean": 0.75}, phase="periodic")  # after step 2: late
    logger.log_event({"kind": "orchestrator.step", "start": 9.0, "duration_s": 1.0, "step": 2})
    logger.close()
    assert logger.failure is None

    history = history_rows(run_dir)
    assert [h["_step"] for h in history] == [0, 1, 2]
    assert history[0]["eval/countdown/reward_mean"] == 0.5 and history[0]["eval/countdown/step"] == 0
    assert history[0]["events_table/nrows"] == 2 and history[0]["events_table_2/nrows"] == 1
    # the late eval is kept (in the current row, with its own step as its x axis), not dropped
    assert history[2]["eval/countdown/reward_mean"] == 0.75 and history[2]["eval/countdown/step"] == 1
    assert history[2]["events_table_end/nrows"] == 1
    offline = next((run_dir / "wandb").glob("offline-run-*"))
    tables = {p.name.split("_0_")[0]: json.loads(p.read_text()) for p in offline.glob("files/media/table/*.json")}
    first = tables["events_table"]
    assert first["columns"][:3] == ["kind", "start", "duration_s"] and first["columns"][-1] == "fields"
    assert first["data"][0][0] == "inference.request" and json.loads(first["data"][0][-1]) == {"finish_reason": "stop"}
    assert (offline / "files" / "metadata.json").exists()
    records = read_wandb_records(next(offline.glob("run-*.wandb")))
    code = next(r.artifact for r in records if r.WhichOneof("record_type") == "artifact" and r.artifact.type == "code")
    assert [entry.path for entry in code.manifest.contents] == ["pkg/snap.py"]
    metrics = [r.metric for r in records if r.WhichOneof("record_type") == "metric"]
    assert any(m.glob_name == "eval/countdown/*" and m.step_metric == "eval/countdown/step" for m in metrics)


def test_file_selection(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("a")
    (tmp_path / "notes.bin").write_text("b")
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    (tmp_path / ".venv" / "lib" / "site.py").write_text("c")
    (tmp_path / "src" / "__pycache__").mkdir(parents=True)
    (tmp_path / "src" / "__pycache__" / "m.py").write_text("d")
    (tmp_path / "src" / "m.py").write_text("e")
    (tmp_path / "src" / "huge.py").write_text("f" * 2000)
    found = code_files(tmp_path, 0.001, [".venv", "__pycache__"], max_files=100)
    assert [p.relative_to(tmp_path).as_posix() for p in found] == ["a.py", "src/m.py"]
    assert len(code_files(tmp_path, 1.0, [], max_files=1)) == 1

    logs = tmp_path / "logs"
    for name in ("main.log", "detailed/d.log", "stdout/s.log"):
        (logs / name).parent.mkdir(parents=True, exist_ok=True)
        (logs / name).write_text(name)
    names = [p.relative_to(logs).as_posix() for p in log_files(logs, detailed=False, stdout=False)]
    assert names == ["main.log"]
    names = [p.relative_to(logs).as_posix() for p in log_files(logs, detailed=True, stdout=True)]
    assert names == ["detailed/d.log", "main.log", "stdout/s.log"]
    assert log_files(tmp_path / "none", detailed=True, stdout=True) == []


def test_mode_selection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "Disabled")
    assert wandb_mode() == "disabled"
    monkeypatch.setenv("WANDB_MODE", "bogus")
    with pytest.raises(ValueError, match="WANDB_MODE"):
        wandb_mode()
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    netrc_file = tmp_path / "netrc"
    netrc_file.write_text("machine example.com login a password b\n")
    netrc_file.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc_file))
    assert wandb_mode() == "offline"  # no credentials: never prompt
    netrc_file.write_text("machine api.wandb.ai login user password not-a-real-key\n")
    assert wandb_mode() == "online"
    netrc_file.write_text("")
    monkeypatch.setenv("WANDB_API_KEY", "not-a-real-key")
    assert wandb_mode() == "online"


def test_enabled_follows_use_wandb(tmp_path: Path) -> None:
    assert WandbLogger.enabled(make_config(tmp_path, use_wandb=True).settings(WandbSettings))
    assert not WandbLogger.enabled(make_config(tmp_path, use_wandb=False).settings(WandbSettings))


def test_missing_wandb_gives_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with caplog.at_level(logging.WARNING, logger="telescope.loggers.wandb"):
        logger = make_logger(make_config(tmp_path), tmp_path)
        logger.log_step(1, {"x": 1.0})
        logger.log_rollouts(1, [{"prompt": "p"}])
        logger.close()
    assert logger.failure is not None and INSTALL_HINT in logger.failure
    assert not logger.active
    assert len([r for r in caplog.records if r.name == "telescope.loggers.wandb"]) == 1


def test_wandb_errors_disable_the_logger_once(
    tmp_path: Path, wandb_home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    wandb = pytest.importorskip("wandb")  # the telescope-core[wandb] extra

    def broken_init(**kwargs: Any) -> Any:
        raise RuntimeError("network is down")

    monkeypatch.setattr(wandb, "init", broken_init)
    with caplog.at_level(logging.WARNING, logger="telescope.loggers.wandb"):
        logger = make_logger(make_config(tmp_path, wandb_upload_code=False), tmp_path)
        logger.log_step(1, {"x": 1.0})
        logger.close()
    assert logger.failure == "could not start a W&B run: RuntimeError: network is down"
    assert len([r for r in caplog.records if r.name == "telescope.loggers.wandb"]) == 1
    monkeypatch.undo()

    # a failure after a good start: reported once, then every call is a no-op
    monkeypatch.setenv("WANDB_MODE", "disabled")
    caplog.clear()
    logger = make_logger(make_config(tmp_path, wandb_upload_code=False), tmp_path)
    assert logger.active, logger.failure
    calls: list[int] = []

    def broken_log(values: dict[str, Any], step: int | None = None) -> None:
        calls.append(step or 0)
        raise OSError("disk full")

    monkeypatch.setattr(logger._run, "log", broken_log)
    with caplog.at_level(logging.WARNING, logger="telescope.loggers.wandb"):
        logger.log_step(1, {"x": 1.0})
        logger.log_step(2, {"x": 2.0})
        logger.log_rollouts(2, [{"prompt": "p"}])
        logger.close()
    assert calls == [1]
    assert logger.failure == "W&B log failed: OSError: disk full"
    assert len([r for r in caplog.records if r.name == "telescope.loggers.wandb"]) == 1


WANDB_IDENTITY_VARIABLES = (
    "WANDB_PROJECT",
    "WANDB_NAME",
    "WANDB_TAGS",
    "WANDB_ENTITY",
    "WANDB_RUN_GROUP",
    "WANDB_JOB_TYPE",
    "WANDB_RUN_ID",
    "WANDB_RESUME",
)


@pytest.fixture
def fresh_wandb(wandb_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """W&B offline, with none of the identity variables, read anew: W&B's process-wide
    settings keep the environment of its first start until ``wandb.teardown()``."""
    wandb = pytest.importorskip("wandb")  # the telescope-core[wandb] extra
    monkeypatch.setenv("WANDB_MODE", "offline")
    for variable in WANDB_IDENTITY_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    wandb.teardown()
    yield
    wandb.teardown()


def offline_run_records(run_dir: Path) -> list[Any]:
    """The ``run`` record of each offline run folder under ``run_dir/wandb``, oldest first."""
    folders = sorted((run_dir / "wandb").glob("offline-run-*"))
    return [
        next(r.run for r in read_wandb_records(next(f.glob("run-*.wandb"))) if r.WhichOneof("record_type") == "run")
        for f in folders
    ]


def start_and_close(config: TelescopeConfig, run_dir: Path, steps: range) -> None:
    logger = make_logger(config, run_dir)
    assert logger.active, logger.failure
    for step in steps:
        logger.log_step(step, {"reward/mean": float(step)})
    logger.close()
    assert logger.failure is None


def test_wandb_variables_fill_what_the_config_leaves_at_its_defaults(
    tmp_path: Path, fresh_wandb: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_PROJECT", "env-project")
    monkeypatch.setenv("WANDB_NAME", "env-name")
    monkeypatch.setenv("WANDB_TAGS", "from-env, second")
    monkeypatch.setenv("WANDB_ENTITY", "env-team")
    monkeypatch.setenv("WANDB_RUN_GROUP", "env-group")
    monkeypatch.setenv("WANDB_RUN_ID", "envrunid1")
    unset = config_from_dict(
        {"environments": [{"name": "countdown"}], "run_dir": str(tmp_path / "a"), "wandb_upload_code": False}
    )
    start_and_close(unset, tmp_path / "a", range(1))
    [record] = offline_run_records(tmp_path / "a")
    assert (record.project, record.display_name, list(record.tags)) == (
        "env-project",
        "env-name",
        ["from-env", "second"],
    )
    assert (record.entity, record.run_group, record.run_id) == ("env-team", "env-group", "envrunid1")

    # the config's own values win over the environment
    monkeypatch.delenv("WANDB_RUN_ID")
    start_and_close(make_config(tmp_path / "b", wandb_upload_code=False), tmp_path / "b", range(1))
    [record] = offline_run_records(tmp_path / "b")
    assert (record.project, record.display_name, list(record.tags)) == ("telescope-test", "unit", ["test"])
    assert (record.entity, record.run_group) == ("env-team", "env-group")


def test_a_resumed_run_continues_the_same_wandb_run(
    tmp_path: Path, fresh_wandb: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    config = make_config(run_dir, wandb_upload_code=False)
    start_and_close(config, run_dir, range(2))  # the first start, then a resume in the same directory
    start_and_close(config, run_dir, range(2, 4))
    first, resumed = offline_run_records(run_dir)
    assert first.run_id and resumed.run_id == first.run_id
    assert json.loads((run_dir / "wandb_run.json").read_text())["id"] == first.run_id
    folders = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    # offline-run-<date>_<time>-<id>, with "-1" appended when both started within the same second
    ids = [re.fullmatch(r"offline-run-\d{8}_\d{6}-([a-z0-9]+)(?:-\d+)?", name) for name in folders]
    assert [m.group(1) if m else None for m in ids] == [first.run_id, first.run_id], folders
    assert resumed.resumed or resumed.resume  # the resume record W&B keeps for its server

    # another run (its own directory) gets its own W&B run
    start_and_close(make_config(tmp_path / "other", wandb_upload_code=False), tmp_path / "other", range(1))
    [other] = offline_run_records(tmp_path / "other")
    assert other.run_id != first.run_id


@pytest.mark.requires_dist("telescope-envs")
def test_the_logger_context_names_the_fields_the_config_file_and_command_line_set(tmp_path: Path) -> None:
    from telescope.config.loader import load_config

    path = tmp_path / "c.yaml"
    path.write_text("environments: [{name: countdown}]\nwandb_run_name: mine\n")
    loaded = load_config(path, ["--wandb_tags", "[a]"])
    explicit = set(LoggerContext.from_config(loaded.config.model_copy(deep=True), str(tmp_path)).explicit_fields)
    assert {"environments", "wandb_run_name", "wandb_tags"} <= explicit and "wandb_project" not in explicit
