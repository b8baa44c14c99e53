"""Faults a real run survives, on the CPU: `telescope run` of the quick start in a subprocess, then a fault.

- SIGTERM to the whole process group (as schedulers send it) stops the run within seconds, status
  "interrupted", exit code 130, no process or shared memory left; SIGKILL to it leaves a status that
  readers show as "died" and shared memory that the next start removes;
- an inference server killed with SIGKILL is noticed within seconds, restarted on its placement with
  the current weights, its groups re-dispatched; the run completes, no prompt trained twice;
- a trainer rank killed with SIGKILL: the trainer group restarts from the last checkpoint and the run
  completes, each step recorded once for readers and no shared memory left; without a checkpoint the
  run fails cleanly, says the rank was killed (not out of memory) and prints the command that starts it again;
- a reward function that hangs for some completions is timed out, counted, and the run completes;
- a reward function that always raises fails the run (exit 1) with its error and where it was raised;
- a trainer rank that stops answering (SIGSTOP) is named by the watchdog in status.json and the run fails.

The orchestration logic of each (with fakes, in seconds): tests/core/orchestrator/test_faults.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from telescope.recording.run_liveness import run_state
from telescope.recording.run_reader import RunReader
from telescope.testing.processes import leftovers_after, pid_of
from telescope.transports import shm_folders
from telescope.transports.memory import MemoryTransport

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
QUICK_START = REPO / "configs" / "examples" / "countdown_tiny.yaml"
#: Steps for a run the test stops (signal, kill, hang): more than can finish before it acts. The metrics file is
#: flushed in blocks, and 50-200 steps of this config finished within a block once the loop got faster.
LONGER_THAN_THE_TEST = "5000"
FAST = [
    "--warm_start_steps",
    "0",
    "--group_size",
    "4",
    "--prompts_batch_size_for_trainer",
    "4",
    "--discard_group_zero_advantage",
    "false",
    "--evals",
    "[]",
]

#: An installed plugin (entry point): countdown whose reward hangs for completions of an odd length.
HANGING_REWARD_PLUGIN = """
import threading
from telescope import hookimpl
from telescope_envs.countdown import CountdownEnvironment

class HangingCountdown(CountdownEnvironment):
    def compute_reward(self, completion, sample, eos_token=""):
        if len(completion) % 2:
            threading.Event().wait()  # forever
        return super().compute_reward(completion, sample, eos_token)

@hookimpl
def telescope_register_environments(register):
    register("hanging_countdown", HangingCountdown)
"""


#: An installed plugin: countdown whose reward always raises.
RAISING_REWARD_PLUGIN = """
from telescope import hookimpl
from telescope_envs.countdown import CountdownEnvironment

class RaisingCountdown(CountdownEnvironment):
    def compute_reward(self, completion, sample, eos_token=""):
        raise KeyError("reward_key")

@hookimpl
def telescope_register_environments(register):
    register("raising_countdown", RaisingCountdown)
"""

#: The quick start's countdown problems, for a plugin environment named ``{name}``.
PLUGIN_ENVIRONMENT = (
    "[{{name: {name}, kwargs: {{dataset_name: generated, num_samples: 2000, num_numbers: 2,"
    " max_number: 9, seed: 0, prompt_style: compact}}}}]"
)


def install_plugin(tmp_path: Path, module: str, source: str) -> dict[str, str]:
    """Install ``source`` as plugin module ``module`` (an entry point) in a folder; the env that puts it on the path."""
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{module}.py").write_text(source, encoding="utf-8")
    info = site / f"{module}-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text(f"[telescope]\n{module} = {module}\n")
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


def telescope(run_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`telescope run` of the quick start in its own process group (a session), as a scheduler starts it."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "TELESCOPE_PROGRESS": "lines", **(env or {})}
    command = [
        sys.executable,
        "-c",
        "import sys; from telescope.cli.main import main; sys.exit(main(sys.argv[1:]))",
        "run",
        str(QUICK_START),
        "--run_dir",
        str(run_dir),
        *FAST,
        *args,
    ]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )


def wait_for_steps(process: subprocess.Popen[str], run_dir: Path, steps: int, timeout: float = 480) -> None:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while not (metrics.exists() and metrics.read_text().count("\n") >= steps):
        if process.poll() is not None:
            _, err = process.communicate()
            raise AssertionError(f"the run ended before step {steps}:\n{err[-3000:]}")
        assert time.monotonic() < deadline, f"step {steps} was not reached in time"
        time.sleep(0.2)


def finish(process: subprocess.Popen[str], timeout: float = 480) -> str:
    try:
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, err = process.communicate()
        raise AssertionError(f"the run did not end in time:\n{err[-3000:]}") from None
    return err


def _weight_folders(run_dir: Path) -> set[Path]:
    """The memory transport's shared-memory folders of runs in directories named like ``run_dir``."""
    return set(Path("/dev/shm").glob(f"telescope-weights-p*-{run_dir.name}-*"))


def status(run_dir: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((run_dir / "status.json").read_text())
    return data


@pytest.mark.exclusive  # asserts how fast the run reacts: not beside other tests
def test_sigterm_to_the_process_group_stops_the_run_cleanly_within_seconds(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    before = _weight_folders(run_dir)
    process = telescope(run_dir, "--number_of_steps", LONGER_THAN_THE_TEST, "--inference_base_port", "8251")
    wait_for_steps(process, run_dir, 2)
    signalled = time.monotonic()
    os.killpg(process.pid, signal.SIGTERM)  # the driver, Ray's GCS, raylet and workers all get it
    err = finish(process, timeout=120)
    took = time.monotonic() - signalled
    assert process.returncode == 130, err[-3000:]
    assert took < 30, f"the run took {took:.0f} s to stop"
    assert "interrupted" in err
    final = status(run_dir)
    assert final["status"] == "interrupted" and final["end_time"] and "SIGTERM" in str(final["error"])
    assert leftovers_after(str(run_dir)) == []
    assert not any(f"-{run_dir.name}-" in f.name for f in _weight_folders(run_dir) - before)


def test_a_run_killed_with_its_process_group_reads_died_and_its_shared_memory_goes_at_the_next_start(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    before = _weight_folders(run_dir)
    process = telescope(run_dir, "--number_of_steps", LONGER_THAN_THE_TEST, "--inference_base_port", "8259")
    wait_for_steps(process, run_dir, 1)
    os.killpg(process.pid, signal.SIGKILL)  # driver, Ray and rank 0 alike: no cleanup runs anywhere
    process.communicate(timeout=60)
    left = _weight_folders(run_dir) - before
    assert left, "rank 0's folder should outlive a SIGKILL of everything"
    final = status(run_dir)
    assert final["status"] == "running" and run_state(final).status == "died"
    # Ray starts its workers in process groups of their own: each ends within about a second of its raylet
    # (telescope.runtime.worker_lifetime; Ray's own check took one to several minutes). A bound on "it goes".
    deadline = time.monotonic() + 150
    while any(shm_folders.pid_alive(shm_folders.owner_pid(f) or 0) for f in left):
        assert time.monotonic() < deadline, "rank 0 outlived the SIGKILL of its process group"
        time.sleep(0.2)
    next_start = MemoryTransport(None)
    next_start.prepare_sender(1)  # what the next run's rank 0 does first
    next_start.close()
    assert not any(f.exists() for f in left)
    assert leftovers_after(str(run_dir)) == []


@pytest.mark.exclusive  # asserts how fast the run reacts: not beside other tests
def test_a_killed_inference_server_is_restarted_with_the_current_weights(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = telescope(run_dir, "--number_of_steps", "6", "--inference_base_port", "8253")
    wait_for_steps(process, run_dir, 2)
    server = pid_of(str(run_dir), "telescope.inference.embedded.server")
    killed_at = time.time()
    os.kill(server, signal.SIGKILL)
    err = finish(process)
    assert process.returncode == 0, err[-3000:]
    reader = RunReader(run_dir)
    assert reader.status()["status"] == "completed"
    metrics = reader.metrics()
    assert [m["step"] for m in metrics] == list(range(6))
    assert metrics[-1]["infra/server_restarts"] == 1.0
    events = reader.events()
    [restart] = [e for e in events if e["kind"] == "inference.server_restart"]
    assert restart["server"] == 0 and restart["reason"] == "its process exited"
    assert restart["start"] - killed_at < 10, "the dead server was not noticed within seconds"
    # the restarted server got the current weights before it served again (within the restart), then every later one
    loads = [e for e in events if e["kind"] == "weights.load" and e["server"] == 0]
    pushed_before = max(int(e["version"]) for e in loads if e["start"] < killed_at)
    restart_end = restart["start"] + restart["duration_s"]
    resynced = [e for e in loads if restart["start"] <= e["start"] <= restart_end]
    assert resynced and int(resynced[-1]["version"]) >= pushed_before
    assert max(int(e["version"]) for e in loads) == 6
    # its groups ran again elsewhere (here: on it, once back); no prompt lost or trained twice
    dispatched = {e["group_id"] for e in events if e["kind"] == "orchestrator.group_dispatched"}
    ends = [
        e["group_id"]
        for e in events
        if e["kind"] in ("orchestrator.group_completed", "orchestrator.group_discarded", "orchestrator.group_canceled")
    ]
    assert sorted(ends) == sorted(dispatched)
    trained = [r["sample_id"] for r in reader.rollouts()]
    assert len(trained) == 6 * 4 * 4 and len(set(trained)) == 6 * 4
    assert leftovers_after(str(run_dir)) == []


def test_a_killed_trainer_rank_restarts_from_the_last_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    before = _weight_folders(run_dir)
    process = telescope(run_dir, "--number_of_steps", "6", "--checkpoint_every", "2", "--inference_base_port", "8255")
    wait_for_steps(process, run_dir, 3)
    rank0 = _trainer_pid(run_dir)
    assert {f.name.split("-")[2] for f in _weight_folders(run_dir) - before} == {f"p{rank0}"}  # rank 0 owns it
    os.kill(rank0, signal.SIGKILL)
    err = finish(process)
    assert process.returncode == 0, err[-3000:]
    assert "restarting the trainer group from step_0000000" in err
    [failed] = [line for line in err.splitlines() if "trainer failed (" in line]
    assert "its process was killed" in failed and "due to high memory usage" not in failed  # not Ray's OOM guess
    reader = RunReader(run_dir)
    assert reader.status()["status"] == "completed"
    assert _weight_folders(run_dir) - before == set()  # neither the killed rank 0's folder nor the new one's
    metrics = reader.metrics()
    assert metrics[-1]["infra/trainer_restarts"] == 1.0
    assert [m["step"] for m in metrics] == list(range(6))  # the current attempt's: each step once
    [first, again] = reader.attempts()
    assert (first.start_step, again.reason) == (0, "trainer_restart") and again.start_step in (2, 4)
    [restart] = [e for e in reader.events() if e["kind"] == "orchestrator.trainer_restart"]
    assert "died" in restart["error"]
    assert (run_dir / "checkpoints" / "step_00000006" / "meta.json").exists()
    assert leftovers_after(str(run_dir)) == []


def _trainer_pid(run_dir: Path) -> int:
    """Rank 0's process, from the line its log starts with ("trainer rank 0 of 1: backend fsdp (pid N)")."""
    text = (run_dir / "logs" / "trainer_0.log").read_text()
    line = [line for line in text.splitlines() if "trainer rank 0 of" in line][-1]
    return int(line.rsplit("(pid ", 1)[1].rstrip(")"))


def test_a_killed_trainer_rank_without_a_checkpoint_fails_and_prints_how_to_start_again(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = telescope(run_dir, "--number_of_steps", LONGER_THAN_THE_TEST, "--inference_base_port", "8257")
    wait_for_steps(process, run_dir, 1)
    os.kill(_trainer_pid(run_dir), signal.SIGKILL)
    err = finish(process, timeout=120)
    assert process.returncode == 1, err[-3000:]
    assert "trainer rank 0 died" in err and "checkpoints are off (checkpoint_every: 0)" in err
    assert "its process was killed" in err and "due to high memory usage" not in err  # not Ray's OOM guess
    assert f"To start the run again: telescope run {QUICK_START}" in err and f"--run_dir {run_dir}" in err
    assert "Traceback" not in err
    final = status(run_dir)
    assert final["status"] == "failed" and "trainer rank 0 died" in str(final["error"])
    assert leftovers_after(str(run_dir)) == []


@pytest.mark.exclusive  # asserts how fast the run reacts: not beside other tests
def test_the_watchdog_names_a_trainer_rank_that_stopped_answering(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = telescope(
        run_dir,
        "--number_of_steps",
        LONGER_THAN_THE_TEST,
        "--watchdog_timeout_s",
        "15",
        "--inference_base_port",
        "8261",
    )
    wait_for_steps(process, run_dir, 1)
    rank = _trainer_pid(run_dir)
    os.kill(rank, signal.SIGSTOP)  # alive, but answers nothing: a hang no timeout of its own ends
    try:
        err = finish(process, timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank, signal.SIGCONT)
    assert process.returncode == 1, err[-3000:]
    assert "StuckError: nothing progressed for" in err and "stuck: trainer rank 0 does not answer" in err
    final = status(run_dir)
    assert final["status"] == "failed" and "trainer rank 0 does not answer" in str(final["error"])
    stuck = final["stuck"]
    assert isinstance(stuck, dict) and stuck["component"] == "trainer_rank" and stuck["rank"] == 0
    assert any(f.get("component") == "inference_server" and f["ok"] for f in stuck["findings"])
    # the rank stops wherever it is: in a training step or sending weights (both wait on it); CI saw both
    assert re.search(r"The orchestrator was (training step \d+|pushing weights version \d+)", str(final["error"]))
    # the stopped rank is killed without waiting for a close it cannot answer (the shutdown waited 30 s for it)
    log = (run_dir / "logs" / "orchestrator.log").read_text()
    assert "trainer rank 0 does not answer a ping within 5 s: killed without closing it" in log
    stuck_at = _logged_at(log, "ERROR telescope.orchestrator.watchdog")
    failed_at = _logged_at(log, "run failed")
    assert failed_at - stuck_at < 25, f"the run took {failed_at - stuck_at:.0f} s to stop after the watchdog fired"
    assert leftovers_after(str(run_dir)) == []


def _logged_at(log: str, marker: str) -> float:
    """The time (s since the epoch) of the first line of ``log`` that holds ``marker``."""
    line = next(line for line in log.splitlines() if marker in line)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_a_reward_that_hangs_is_timed_out_and_the_run_completes(tmp_path: Path) -> None:
    env = install_plugin(tmp_path, "hanging_reward_plugin", HANGING_REWARD_PLUGIN)
    run_dir = tmp_path / "run"
    environments = PLUGIN_ENVIRONMENT.format(name="hanging_countdown")
    process = telescope(
        run_dir,
        "--number_of_steps",
        "3",
        "--environments",
        environments,
        "--reward_timeout_s",
        "1",
        "--inference_base_port",
        "8259",
        env=env,
    )
    err = finish(process)
    assert process.returncode == 0, err[-3000:]
    metrics = RunReader(run_dir).metrics()
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert sum(m["timeouts/reward/count"] for m in metrics) > 0
    assert all(len(r["completion"]) % 2 == 0 for r in RunReader(run_dir).rollouts())


def test_a_reward_that_always_raises_fails_the_run_with_its_error(tmp_path: Path) -> None:
    env = install_plugin(tmp_path, "raising_reward_plugin", RAISING_REWARD_PLUGIN)
    run_dir = tmp_path / "run"
    process = telescope(
        run_dir,
        "--number_of_steps",
        "3",
        "--environments",
        PLUGIN_ENVIRONMENT.format(name="raising_countdown"),
        "--eval_before_training",
        "false",
        "--eval_after_training",
        "false",
        "--max_consecutive_errored_batches",
        "1",
        "--inference_base_port",
        "8263",
        env=env,
    )
    err = finish(process)
    assert process.returncode == 1, err[-3000:]
    plugin = tmp_path / "site" / "raising_reward_plugin.py"
    where = f"raised at {plugin}:7 in compute_reward"
    assert "every rollout of the last 4 groups (1 x prompts_batch_size_for_trainer 4) errored" in err, err[-3000:]
    assert where in err
    final = status(run_dir)
    assert final["status"] == "failed"
    assert "KeyError in compute_reward of sample" in str(final["error"]) and "'reward_key'" in str(final["error"])
    assert where in str(final["error"])
    assert RunReader(run_dir).metrics() == []  # no step was trained
