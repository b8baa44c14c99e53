"""The run store: layout, whole-line appends, crash tolerance, concurrent reading, run dir naming."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from telescope.api import events
from telescope.api.records import Attachment, FinishReason, Group, RewardResult, Rollout, Sample, Turn
from telescope.recording.run_reader import JsonlFollower, RunReader
from telescope.recording.run_store import (
    RunStore,
    RunStoreClosedError,
    group_records,
    resolve_run_dir,
    resolve_run_dir_from_config,
    rollout_record,
)


def make_rollout(reward: float, *, versions: tuple[int, ...] = (3,), finish: FinishReason = "stop") -> Rollout:
    turns = [
        Turn(
            input_token_ids=[1, 2, 3] if i == 0 else [9],
            output_token_ids=[4, 5],
            output_logprobs=[-0.1, -0.2],
            policy_version=v,
            finish_reason=finish if i == len(versions) - 1 else "stop",
            output_text=f"t{i}",
        )
        for i, v in enumerate(versions)
    ]
    return Rollout(
        sample=Sample(prompt="2+2?", answer=4, sample_id="s7", environment="countdown"),
        turns=turns,
        reward=RewardResult(total_reward=reward, sample_metrics={"correct": reward}),
    )


def test_layout_and_round_trip(tmp_path: Path) -> None:
    with RunStore(tmp_path / "run") as store:
        store.write_config("model: tiny", {"model": "tiny", "learning_rate": 1e-6})
        store.set_status("running", step=0)
        store.log_metrics(1, {"reward/mean": 0.5, "n": np.int64(3), "bad": float("nan")}, timestamp=10.0)
        store.log_metrics(2, {"reward/mean": np.float32(0.75)})
        store.log_eval("math500", 2, {"pass@1": 0.25}, num_problems=4)
        store.set_status("completed", step=2)
    reader = RunReader(tmp_path / "run")
    assert reader.exists()
    assert reader.config() == {"model": "tiny", "learning_rate": 1e-6}
    assert reader.config_text() == "model: tiny\n"
    metrics = reader.metrics()
    # numpy values become plain numbers; NaN becomes null (strict JSON)
    assert metrics[0] == {"step": 1, "time": 10.0, "reward/mean": 0.5, "n": 3, "bad": None}
    assert metrics[1]["step"] == 2 and metrics[1]["reward/mean"] == 0.75
    assert "NaN" not in (tmp_path / "run" / "metrics.jsonl").read_text()
    evals = reader.evals("math500")
    assert evals[0]["metrics"] == {"pass@1": 0.25} and evals[0]["num_problems"] == 4 and evals[0]["step"] == 2
    status = reader.status()
    assert status is not None
    assert status["status"] == "completed" and status["step"] == 2
    assert status["end_time"] >= status["start_time"] > 0
    assert isinstance(status["pid"], int)
    assert (tmp_path / "run" / "logs").is_dir()


def test_rollout_records_carry_every_field(tmp_path: Path) -> None:
    groups = [
        Group(
            sample=Sample(prompt="p"), rollouts=[make_rollout(1.0), make_rollout(0.0, versions=(2, 4), finish="length")]
        )
    ]
    with RunStore(tmp_path) as store:
        store.log_rollouts(5, group_records(5, groups, {(0, 0): 0.5, (0, 1): -0.5}))
    records = RunReader(tmp_path).rollouts(step=5)
    assert len(records) == 2
    first, second = records
    assert first["prompt"] == "2+2?" and first["completion"] == "t0"
    assert first["reward"] == 1.0 and first["advantage"] == 0.5
    assert first["sample_metrics"] == {"correct": 1.0}
    assert first["environment"] == "countdown" and first["sample_id"] == "s7"
    assert (first["group_index"], first["rollout_index"], second["rollout_index"]) == (0, 0, 1)
    assert (first["prompt_tokens"], first["completion_tokens"], first["total_tokens"]) == (3, 2, 5)
    # two turns: 3 prompt + 2 generated + 1 env reply + 2 generated = 8; completion = 2 + 2
    assert (second["completion_tokens"], second["total_tokens"]) == (4, 8)
    assert second["policy_versions"] == [2, 4] and second["policy_version"] == 2
    assert second["stop_reason"] == "length" and second["error"] is None
    assert "tags" not in first
    assert RunReader(tmp_path).rollouts(step=6) == []


def test_attachments_become_files_of_the_run_and_records_keep_their_paths(tmp_path: Path) -> None:
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
    shots = [Attachment("page", "image/png", png, turn=0), Attachment("page", "image/png", png[:20], turn=1)]
    rollout = dataclasses.replace(make_rollout(1.0), attachments=shots)
    groups = [Group(sample=Sample(prompt="p"), rollouts=[rollout, make_rollout(0.0)])]
    with RunStore(tmp_path) as store:
        records = store.store_attachments(group_records(3, groups))
        store.log_rollouts(3, records)
        store.log_rollouts(3, [rollout])  # a bare rollout: written by log_rollouts itself
    first, plain, bare = RunReader(tmp_path).rollouts(step=3)
    assert "attachments" not in plain
    for record in (first, bare):
        entries = record["attachments"]
        assert [(e["name"], e["media_type"], e["turn"], e["bytes"]) for e in entries] == [
            ("page", "image/png", 0, len(png)),
            ("page", "image/png", 1, 20),
        ]
        assert all("data" not in e and e["path"].startswith("media/step-3/") for e in entries)
        assert (tmp_path / entries[0]["path"]).read_bytes() == png
        assert (tmp_path / entries[1]["path"]).read_bytes() == png[:20]
    assert first["attachments"][0]["path"] != bare["attachments"][0]["path"]  # never overwritten
    assert store.store_attachments(records) == records  # already written: left as they are


def test_a_sample_s_tags_go_into_its_rollout_records() -> None:
    rollout = make_rollout(1.0)
    tagged = Rollout(
        sample=Sample(prompt="p", metadata={"tags": {"level": 3, "subject": "algebra"}}),
        turns=rollout.turns,
        reward=rollout.reward,
    )
    record = rollout_record(tagged, step=0, group_index=0)
    assert record["tags"] == {"level": 3, "subject": "algebra"}


def test_each_turn_records_its_tokens_versions_as_runs_and_segments_theirs() -> None:
    across = Turn([1, 2], [5, 6, 7, 8], [-0.1] * 4, policy_version=3, output_policy_versions=[3, 3, 4, 4])
    closed = Turn([1], [9], [-0.2], policy_version=2)
    rollout = Rollout(Sample("p", sample_id="s"), [across], segments=[[closed]], compactions=1)
    record = rollout_record(rollout, step=0, group_index=0, rollout_index=0)
    assert record["turns"][0]["versions"] == [[3, 2], [4, 2]]
    assert record["segment_turns"] == [
        [{"input_tokens": 1, "output_tokens": 1, "policy_version": 2, "finish_reason": "stop", "versions": [[2, 1]]}]
    ]


def test_events_are_captured_until_unsubscribed(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    unsubscribe = store.capture_events()
    events.emit("sandbox.execute", sandbox_id="a", exit_code=0)
    with events.timed("trainer.forward", step=1):
        pass
    unsubscribe()
    events.emit("sandbox.execute", sandbox_id="after")
    store.capture_events()
    store.close()  # close unsubscribes too
    events.emit("sandbox.execute", sandbox_id="after-close")  # must not raise
    reader = RunReader(tmp_path)
    assert [e["kind"] for e in reader.events()] == ["sandbox.execute", "trainer.forward"]
    assert [e["sandbox_id"] for e in reader.events("sandbox")] == ["a"]
    assert reader.events("trainer.forward")[0]["step"] == 1


def test_partial_last_line_is_skipped_and_isolated_on_resume(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.log_metrics(1, {"x": 1.0})
    store.close()
    path = tmp_path / "metrics.jsonl"
    with path.open("a") as handle:  # a crash in the middle of a write
        handle.write('{"step": 2, "x": 2.')
    assert [m["step"] for m in RunReader(tmp_path).metrics()] == [1]
    resumed = RunStore(tmp_path)  # the resumed run appends after a newline
    resumed.log_metrics(2, {"x": 2.5})
    resumed.close()
    follower = JsonlFollower(path)
    assert [(m["step"], m["x"]) for m in follower.read_new()] == [(1, 1.0), (2, 2.5)]
    assert follower.skipped_lines == 1
    assert path.read_text().count("\n") == 3


def test_reserved_keys_closed_store_and_bad_status(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    with pytest.raises(ValueError, match="reserved"):
        store.log_metrics(1, {"step": 3})
    with pytest.raises(ValueError, match="unknown run status"):
        store.set_status("paused")  # type: ignore[arg-type]
    store.close()
    with pytest.raises(RunStoreClosedError):
        store.log_metrics(1, {"x": 1})


def test_resumed_status_keeps_start_time_and_clears_end_time(tmp_path: Path) -> None:
    with RunStore(tmp_path) as store:
        first = store.set_status("interrupted", step=4)
    with RunStore(tmp_path) as store:
        again = store.set_status("running")
    assert again["start_time"] == first["start_time"]
    assert again["step"] == 4 and again["end_time"] is None


def test_reader_sees_whole_records_while_writer_threads_append(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    payload = "x" * 3000  # long lines: a reader often catches a write half done
    steps_per_writer, writers = 150, 3
    done = threading.Event()

    def write(offset: int) -> None:
        for i in range(steps_per_writer):
            store.log_rollouts(i, [{"writer": offset, "i": i, "completion": payload}])

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    seen_counts: list[int] = []
    follower = RunReader(tmp_path).follow("rollouts")
    followed: list[dict[str, object]] = []

    def read() -> None:
        while not done.is_set():
            records = RunReader(tmp_path).rollouts()
            assert all(r["completion"] == payload for r in records)
            seen_counts.append(len(records))
            followed.extend(follower.read_new())
            time.sleep(0.001)

    reader_thread = threading.Thread(target=read)
    reader_thread.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    reader_thread.join()
    store.flush()  # rollouts are written by the store's writer thread, a moment after log_rollouts
    followed.extend(follower.read_new())
    store.close()
    total = steps_per_writer * writers
    assert seen_counts == sorted(seen_counts)  # never loses a line it saw before
    assert len(followed) == total and follower.skipped_lines == 0
    for writer in range(writers):  # each writer's records in its order, none lost or merged
        assert [r["i"] for r in followed if r["writer"] == writer] == list(range(steps_per_writer))
    assert len(RunReader(tmp_path).rollouts()) == total


def test_follower_returns_only_new_records(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    follower = RunReader(tmp_path).follow("metrics")
    assert follower.read_new() == []
    store.log_metrics(1, {"a": 1})
    assert [m["a"] for m in follower.read_new()] == [1]
    assert follower.read_new() == []
    store.log_metrics(2, {"a": 2})
    store.log_metrics(3, {"a": 3})
    assert [m["a"] for m in follower.read_new()] == [2, 3]
    store.close()
    with pytest.raises(ValueError, match="no stream"):
        RunReader(tmp_path).follow("nope")


def test_log_path_kinds(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    paths = [store.log_path("trainer"), store.log_path("trainer", "detailed"), store.log_path("vllm", "stdout")]
    for path in paths:
        path.write_text("hello\n")
    store.close()
    logs = RunReader(tmp_path).logs()
    assert [p.relative_to(tmp_path).as_posix() for p in logs] == [
        "logs/detailed/trainer.log",
        "logs/stdout/vllm.log",
        "logs/trainer.log",
    ]


def test_resolve_run_dir_never_clobbers(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first = resolve_run_dir(None, "exp", runs_root=runs)
    assert first == runs / "exp" and first.is_dir()
    assert resolve_run_dir(None, "exp", runs_root=runs) == first  # still empty: reused
    (first / "metrics.jsonl").write_text("{}\n")
    second = resolve_run_dir(None, "exp", runs_root=runs)
    assert second == runs / "exp-1"
    (second / "status.json").write_text("{}")
    assert resolve_run_dir(None, "exp", runs_root=runs) == runs / "exp-2"
    assert resolve_run_dir(None, "exp", resume=True, runs_root=runs) == first  # resume: same dir
    explicit = tmp_path / "mine"
    assert resolve_run_dir(str(explicit), "ignored", runs_root=runs) == explicit
    with pytest.raises(ValueError, match="cannot name a directory"):
        resolve_run_dir(None, "../x", runs_root=runs)


def test_resolve_run_dir_from_config(tmp_path: Path) -> None:
    from telescope.schema.config import TelescopeConfig

    config = TelescopeConfig.model_validate(
        {"environments": [{"name": "countdown"}], "wandb_run_name": "abc", "resume_from_checkpoint": True}
    )
    target = resolve_run_dir_from_config(config, runs_root=tmp_path)
    (target / "x").write_text("")
    assert resolve_run_dir_from_config(config, runs_root=tmp_path) == tmp_path / "abc"  # resuming
    config = config.model_copy(update={"resume_from_checkpoint": False})
    assert resolve_run_dir_from_config(config, runs_root=tmp_path) == tmp_path / "abc-1"


def test_status_json_is_always_complete(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.set_status("running", step=0)
    stop = threading.Event()
    bad: list[str] = []

    def read() -> None:
        while not stop.is_set():
            text = (tmp_path / "status.json").read_text()
            try:
                json.loads(text)
            except ValueError:
                bad.append(text)

    thread = threading.Thread(target=read)
    thread.start()
    for step in range(200):
        store.set_status("running", step=step, loss=math.pi)
    stop.set()
    thread.join()
    store.close()
    assert bad == []
    assert RunReader(tmp_path).status()["step"] == 199  # type: ignore[index]
