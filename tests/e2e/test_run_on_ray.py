"""`telescope run` for real: Ray, the embedded engine, the FSDP trainer, the run store.

Short runs of the CPU quick-start config (fewer steps, a shorter warm start), driven
through the command line in a subprocess as a user would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from telescope.recording.run_reader import RunReader
from telescope.testing.processes import leftovers_after

REPO = Path(__file__).resolve().parents[2]
QUICK_START = REPO / "configs" / "examples" / "countdown_tiny.yaml"
FAST = [
    "--warm_start_steps",
    "60",
    "--group_size",
    "4",
    "--prompts_batch_size_for_trainer",
    "4",
    "--discard_group_zero_advantage",
    "false",
    "--inference_base_port",
    "8231",
    "--evals",
    "[{name: countdown, num_samples: 8, separate_eval_samples: true, pass_k: {k: [1, 2], n: 2},"
    " kwargs: {dataset_name: generated, num_samples: 2000, num_numbers: 2, max_number: 9, seed: 0,"
    " prompt_style: compact}}]",
]


#: A plugin, published by entry point, that appends each lifecycle call to the file $LIFECYCLE_LOG.
LIFECYCLE_PLUGIN = """
import json, os
from telescope import hookimpl

def _log(*record):
    with open(os.environ["LIFECYCLE_LOG"], "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\\n")

@hookimpl
def telescope_run_start(config, run_dir):
    _log("run_start", str(run_dir))

@hookimpl
def telescope_step_end(step, metrics):
    _log("step_end", step, metrics["reward/mean"])

@hookimpl
def telescope_run_end(run_dir, status, error):
    _log("run_end", str(run_dir), status, error is None)
"""


def publish_lifecycle_plugin(site: Path) -> None:
    """The plugin as an installed distribution on ``site`` (put it on PYTHONPATH)."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "lifecycle_log_plugin.py").write_text(LIFECYCLE_PLUGIN, encoding="utf-8")
    info = site / "lifecycle_log_plugin-0.0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lifecycle-log-plugin\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[telescope]\nlifecycle_log_plugin = lifecycle_log_plugin\n")


_started: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _stop_runs_left_running() -> Iterator[None]:
    """A test that fails while its run trains must not leave the run going (a failed Ctrl-C test once
    left its run training for 12 minutes, loading the machine under the tests after it)."""
    yield
    while _started:
        process = _started.pop()
        if process.poll() is None:
            process.terminate()  # the run's own SIGTERM handling stops its workers
            try:
                process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()


def _default_sigint() -> None:
    """In the child: SIGINT as a terminal delivers it. A test runner started in the background (``cmd &``)
    ignores SIGINT, children inherit that, and Python then installs no handler: the Ctrl-C test's run
    ignored its SIGINT and trained on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def telescope(run_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
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
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=_default_sigint
    )
    _started.append(process)
    return process


@pytest.mark.slow
def test_a_short_run_records_every_metric(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    publish_lifecycle_plugin(tmp_path / "site")
    lifecycle_log = tmp_path / "lifecycle.jsonl"
    plugin_env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")])),
        "LIFECYCLE_LOG": str(lifecycle_log),
    }
    process = telescope(run_dir, "--number_of_steps", "3", "--checkpoint_every", "3", env=plugin_env)
    _, err = process.communicate(timeout=540)
    assert process.returncode == 0, err[-3000:]
    reader = RunReader(run_dir)
    assert reader.status()["status"] == "completed"
    metrics = reader.metrics()
    assert [m["step"] for m in metrics] == [0, 1, 2]
    # the lifecycle hooks of an installed plugin: once per run, once per step with its metrics, in order
    lifecycle = [json.loads(line) for line in lifecycle_log.read_text(encoding="utf-8").splitlines()]
    assert lifecycle == [
        ["run_start", str(run_dir)],
        *(["step_end", m["step"], m["reward/mean"]] for m in metrics),
        ["run_end", str(run_dir), "completed", True],
    ]
    required = [
        "loss",
        "entropy",
        "kl_divergence_inference",
        "grad_norm",
        "learning_rate",
        "reward/mean",
        "reward/std",
        "reward/min",
        "reward/max",
        "reward/gini_mean",
        "advantage/mean",
        "sample_metrics/correct/mean",
        "sample_metrics/correct/gini_mean",
        "tokens/prompt/mean",
        "tokens/completion/max",
        "tokens/total/std",
        "stop_reason_length_pct",
        "group_length_gini_mean",
        "group_length_max_median_ratio_mean",
        "discarded/zero_advantage/count",
        "discarded/canceled/count",
        "discarded/max_async/count",
        "timing_step_total",
        "timing_step_active",
        "timing_waiting_for_data",
        "timing_weight_sync_trainer_total",
        "timing_weight_sync_inference_total",
    ]
    for key in required:
        assert key in metrics[-1], key
    # the trainer saw the inference engine's log-probabilities of the same weights (step 0 is on-policy)
    assert metrics[0]["kl_divergence_inference"] < 1e-3
    rollouts = reader.rollouts()
    assert len(rollouts) == 3 * 4 * 4
    assert {"prompt", "completion", "reward", "advantage", "sample_metrics", "policy_version", "stop_reason"} <= set(
        rollouts[0]
    )
    # one node: the server listens on loopback only (inference_host: auto), and the run's clients, holding
    # its token, generated, pushed weights and scraped metrics there
    [placed] = [e for e in reader.events() if e["kind"] == "worker.placed" and e["component"] == "inference"]
    assert placed["url"].startswith("http://127.0.0.1:"), placed
    infra = [e for e in reader.events() if e["kind"].startswith("infra.")]  # the monitor's, in the run store
    assert {"infra.system", "infra.torch_memory", "infra.inference"} <= {e["kind"] for e in infra}
    assert all("node" in e for e in infra if e["kind"] != "infra.inference")
    phases = [e["phase"] for e in reader.evals()]
    assert phases == ["before", "after"]
    assert "eval/countdown/pass@2" in reader.evals()[-1]["metrics"]
    assert "step 3/3" in err or "train step 3/3" in err
    assert leftovers_after(str(run_dir)) == []
    assert_timeline_and_metadata(reader)

    # `telescope eval` scores the saved checkpoint with the same evals, without a trainer
    assert (run_dir / "checkpoints" / "step_00000003" / "model.safetensors").exists()
    output = tmp_path / "standalone"
    command = [
        sys.executable,
        "-c",
        "import sys; from telescope.cli.main import main; sys.exit(main(sys.argv[1:]))",
        "eval",
        str(QUICK_START),
        str(run_dir),
        "--output",
        str(output),
        *FAST,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, **plugin_env})
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(lifecycle_log.read_text(encoding="utf-8").splitlines()) == len(lifecycle)  # eval calls no run hook
    assert "correct_rate" in result.stdout
    [standalone] = RunReader(output).evals()
    assert standalone["phase"] == "standalone"
    assert set(standalone["metrics"]) == set(reader.evals()[-1]["metrics"])
    assert leftovers_after(str(output)) == []


#: Event kinds every run of the quick start records (issue 10: inference, trainer, weights, orchestrator,
#: reward and eval categories; the quick start uses no tools or sandboxes).
EXPECTED_KINDS = {
    "inference.request",
    "inference.queue",
    "inference.prefill",
    "inference.decode",
    "trainer.step",
    "trainer.data_to_device",
    "trainer.forward",
    "trainer.loss_computation",
    "trainer.backward",
    "trainer.optimizer",
    "trainer.prewarm",
    "weights.send",
    "weights.load",
    "weights.sync",
    "orchestrator.group_dispatched",
    "orchestrator.group_completed",
    "orchestrator.batch_assembled",
    "orchestrator.step",
    "orchestrator.checkpoint",
    "reward.compute",
    "eval.run",
    "run.ray_start",
    "run.servers_start",
    "run.workers_start",
    "worker.startup",
    "worker.placed",
}


def assert_startup_phases(events: list[dict]) -> None:
    """Ray's start, then the workers' (each worker's own start-up inside it), then the first train step.

    The servers' half ends first (``run.servers_start``): requests may begin while the
    trainer ranks still set up, and the trainer's weights go out once they are ready.
    """

    def end(event: dict) -> float:
        return float(event["start"] + event["duration_s"])

    [ray_start] = [e for e in events if e["kind"] == "run.ray_start"]
    [servers_start] = [e for e in events if e["kind"] == "run.servers_start"]
    [workers_start] = [e for e in events if e["kind"] == "run.workers_start"]
    startups = {(e["component"], e.get("rank", e.get("server"))): e for e in events if e["kind"] == "worker.startup"}
    assert sorted(startups) == [("inference", 0), ("trainer", 0)]
    assert end(ray_start) <= workers_start["start"]
    slack = 0.05  # a process's start time comes from /proc, in clock ticks
    assert abs(servers_start["start"] - workers_start["start"]) <= slack and end(servers_start) <= end(workers_start)
    for startup in startups.values():
        assert startup["duration_s"] > 0 and startup["node"]
        assert ray_start["start"] - slack <= startup["start"] and end(startup) <= end(workers_start) + slack
    assert end(startups["inference", 0]) <= end(servers_start) + slack
    assert end(servers_start) - slack <= min(e["start"] for e in events if e["kind"] == "inference.request")
    assert end(workers_start) - slack <= min(e["start"] for e in events if e["kind"] == "weights.sync")
    assert end(workers_start) <= min(e["start"] for e in events if e["kind"] == "trainer.step")


def assert_timeline_and_metadata(reader: RunReader) -> None:
    """The run store holds every category's events with the ids that draw their lanes, the metadata and logs."""
    events = reader.events()
    kinds = {e["kind"] for e in events}
    assert EXPECTED_KINDS <= kinds, sorted(EXPECTED_KINDS - kinds)
    requests = [e for e in events if e["kind"] == "inference.request"]
    assert all(e["server"] == 0 and e["sample_id"] and e["request_id"] and "turn" in e for e in requests)
    assert any("group_id" in e for e in requests) and any("eval" in e for e in requests)
    trainer = [e for e in events if e["kind"].startswith("trainer.")]
    assert {e["step"] for e in trainer} == {0, 1, 2} and {e["rank"] for e in trainer} == {0}
    assert {e["version"] for e in events if e["kind"] == "weights.load"} == {0, 1, 2, 3}
    assert [e["step"] for e in events if e["kind"] == "orchestrator.step"] == [0, 1, 2]
    assert_startup_phases(events)
    run_dir = reader.run_dir
    metadata = json.loads((run_dir / "metadata.json").read_text())
    assert metadata["environments"][0]["name"] == "countdown" and metadata["host"]["versions"]["ray"]
    assert (run_dir / "code" / "telescope-core" / "src" / "telescope" / "api" / "events.py").exists()
    trainer_log = (run_dir / "logs" / "trainer_0.log").read_text()
    assert "trainer rank 0 of 1" in trainer_log and "step 2: loss" in trainer_log
    console = run_dir / "logs" / "stdout"
    assert "telescope: run directory" in (console / "orchestrator.log").read_text()
    assert (console / "trainer_0.log").exists() and (console / "inference_0.log").exists()
    assert "run completed" in (run_dir / "logs" / "detailed" / "orchestrator.log").read_text()


@pytest.mark.slow
def test_ctrl_c_stops_every_worker(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # more steps than can finish before the signal: the metrics file is flushed in blocks, and 200 steps of
    # this config took under 40 s once the loop got faster, so the run had completed when it was signalled
    # no progress lines: stderr is read only at the end, and a line per fast step filled the pipe and blocked the run
    process = telescope(run_dir, "--number_of_steps", "5000", env={"TELESCOPE_PROGRESS": "off"})
    metrics_file = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 480
    while not (metrics_file.exists() and metrics_file.read_text().count("\n") >= 2):
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        assert time.monotonic() < deadline, "no training step finished in time"
        time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err[-3000:]
    assert "interrupted" in err
    assert json.loads((run_dir / "status.json").read_text())["status"] == "interrupted"
    assert leftovers_after(str(run_dir)) == []


@pytest.mark.slow
def test_workers_that_cannot_be_placed_fail_cleanly(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    process = telescope(
        run_dir, "--ray_trainer_cpus_per_worker", "64", "--ray_placement_timeout_s", "5", "--warm_start_steps", "0"
    )
    _, err = process.communicate(timeout=300)
    assert process.returncode == 2, err[-3000:]
    assert "could not place 1 trainer workers" in err and "ray_trainer_cpus_per_worker" in err
    assert "Traceback" not in err
    assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"
    assert leftovers_after(str(run_dir)) == []


@pytest.mark.slow
@pytest.mark.exclusive  # two Ray start-ups at once: not beside a third
def test_two_runs_on_one_machine_at_once_both_complete(tmp_path: Path) -> None:
    """With ``ray_address: auto`` and no `ray start` cluster, each run starts a Ray cluster of its own.

    Before, the second run attached to the cluster the first had started for itself and
    failed on a placement-group name clash (and the first run's shutdown would have
    taken the cluster from under it). The second starts once the first's cluster and
    workers are up (the case that failed; it also spares a loaded machine two Ray
    start-ups at once, which Ray bounds at 30 s), and both train at the same time. Both
    ask for the same inference port: while the first's server holds it, the second's
    takes another one.
    """
    runs = [tmp_path / "first", tmp_path / "second"]
    args = ("--number_of_steps", "2", "--warm_start_steps", "10")
    first = telescope(runs[0], "--number_of_steps", "6", "--warm_start_steps", "10")
    log = runs[0] / "logs" / "orchestrator.log"
    deadline = time.monotonic() + 300
    while not (log.exists() and "placed 1 inference servers" in log.read_text()):
        assert first.poll() is None, first.stderr.read() if first.stderr else ""
        assert time.monotonic() < deadline, "the first run's workers were not placed in time"
        time.sleep(0.5)
    processes = [first, telescope(runs[1], *args)]
    results = [process.communicate(timeout=540) for process in processes]
    for process, (_, err) in zip(processes, results, strict=True):
        assert process.returncode == 0, err[-3000:]
    servers = []  # (url, when it was up, when its run ended)
    for run_dir, steps in zip(runs, (6, 2), strict=True):
        reader = RunReader(run_dir)
        status = reader.status()
        assert status["status"] == "completed"
        assert [m["step"] for m in reader.metrics()] == list(range(steps))
        [server] = [e for e in reader.events() if e["kind"] == "worker.placed" and e["component"] == "inference"]
        servers.append((server["url"], server["start"], status["end_time"]))
        assert leftovers_after(str(run_dir)) == []
    assert RunReader(runs[1]).status()["start_time"] < servers[0][2]  # the runs overlapped
    (first_url, first_up, first_end), (second_url, second_up, second_end) = servers
    if first_up < second_end and second_up < first_end:  # both servers up at once: one port each
        assert first_url != second_url, servers
