"""Where a training step's time and the machine's CPU go: the loop's per-step overheads, measured.

Runs the CPU loop of ``bench_vs_trl.py`` (the quick start's model and prompts, no warm
start, no evals) for ``--steps`` steps, samples the CPU time of every process of
the run while it runs (psutil), and reads the run's own records back:

- per step (median over the steps after the first): the orchestrator's step, the
  trainer's compute (forward, backward, optimizer), the wait for rollouts, the
  weight sync, and the rest (the Ray call to the trainer, batch assembly,
  metrics and recording): ``timing_step_total`` less the named parts;
- per completion request (median): the time the orchestrator saw less the
  server's own queue, prefill and decode (the request's ``inference.*`` events of
  the same ``request_id``): HTTP, JSON (de)serialisation and both event loops;
- reward computation per sample (median of the ``reward.compute`` events);
- CPU seconds per step of each process (orchestrator, inference server, trainer
  rank, Ray's own processes), start-up included, so the last column says where
  the machine's cores went; and each one's CPU seconds until the first training
  step ended (the start-up's share: on 2 cores their sum over 2 bounds how soon
  that step can come);
- the start-up, from the run's own timeline: Ray's start, the workers' start, each
  worker's process start to its readiness, and the end of the first training step;
  the timeline counts from the run's status ``start_time``, which the run writes
  once its config is loaded and its modules imported (about 1 s after the command
  started, on 2 cores), so the end of the first step is also printed from the
  command's launch (what a user waits for after typing ``telescope run``).

Run by hand: ``python bench/bench_step_overheads.py --steps 40``. Figures depend on
the machine and its load; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from cores_check import report

REPO = Path(__file__).resolve().parents[1]
ENV_KWARGS = {
    "dataset_name": "generated",
    "num_samples": 2000,
    "num_numbers": 2,
    "max_number": 9,
    "seed": 0,
    "prompt_style": "compact",
}


def process_role(command: str) -> str:
    if "telescope.inference.embedded.server" in command:
        return "inference server"
    if "TrainerWorker" in command:
        return "trainer rank"
    if "InferenceWorker" in command:
        return "inference actor (Ray)"
    if "telescope.cli.main" in command:
        return "orchestrator"
    if "ray::" in command or "/ray/" in command or "raylet" in command or "gcs_server" in command:
        return "Ray (GCS, raylet, agents, samplers)"
    return "other"


def startup_phases(events: list[dict]) -> list[tuple[str, dict]]:
    """The run's start-up events (see telescope.runtime.launch), labelled, in the order they began."""
    labels = {
        "run.ray_start": "Ray started (ray.init)",
        "run.workers_start": "workers placed, started and set up",
        "run.servers_start": "  the servers' half (generation may begin)",
    }
    phases = [(labels[e["kind"]], e) for e in events if e["kind"] in labels]
    first = min((e for e in events if e["kind"] == "inference.request"), key=lambda e: e["start"], default=None)
    if first is not None:
        phases.append(("  first request to a server", first))
    for e in events:
        if e["kind"] == "worker.startup":
            who = f"trainer rank {e['rank']}" if e["component"] == "trainer" else f"inference server {e['server']}"
            phases.append((f"  {who}: process start -> ready", e))
    return sorted(phases, key=lambda phase: float(phase[1]["start"]))


def sample_cpu(
    root_pid: int, stop: threading.Event, out: dict[int, tuple[str, float]], history: list[tuple[float, dict]]
) -> None:
    """Latest CPU seconds of the run's processes: the CLI and its descendants (Ray's cluster is started by it).

    ``history`` gets a copy of ``out`` with its time after every round (every 0.5 s).
    """
    import psutil

    root = psutil.Process(root_pid)
    while not stop.is_set():
        try:
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for proc in processes:
            try:
                command = "telescope.cli.main" if proc.pid == root_pid else " ".join(proc.cmdline())
                times = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            role = process_role(command)
            if role == "other" and proc.pid in out:  # an exiting process has no command line left
                role = out[proc.pid][0]
            out[proc.pid] = (role, times.user + times.system)
        history.append((time.time(), dict(out)))
        stop.wait(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--model", default="small")
    parser.add_argument("--max-tokens", dest="max_tokens", type=int, default=24)
    parser.add_argument("--prompts", type=int, default=8, help="prompts_batch_size_for_trainer (8: 64 samples a step)")
    args = parser.parse_args()
    from telescope.recording.run_reader import RunReader

    before = report("before")
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = [
            sys.executable,
            "-c",
            "import sys; from telescope.cli.main import main; sys.exit(main(sys.argv[1:]))",
            "run",
            str(REPO / "configs" / "examples" / "countdown_tiny.yaml"),
            "--run_dir",
            str(run_dir),
            "--model",
            f"tiny:{args.model}",
            "--environments",
            json.dumps([{"name": "countdown", "kwargs": ENV_KWARGS}]),
            "--evals",
            "[]",
            "--warm_start_steps",
            "0",
            "--number_of_steps",
            str(args.steps),
            "--max_tokens",
            str(args.max_tokens),
            "--discard_group_zero_advantage",
            "false",
            "--prompts_batch_size_for_trainer",
            str(args.prompts),
        ]
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "TELESCOPE_PROGRESS": "off"}
        started, launched = time.perf_counter(), time.time()
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cpu: dict[int, tuple[str, float]] = {}
        history: list[tuple[float, dict]] = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample_cpu, args=(process.pid, stop, cpu, history), daemon=True)
        sampler.start()
        if process.wait() != 0:
            raise SystemExit(f"the run failed (exit {process.returncode}); see {run_dir}/logs")
        wall = time.perf_counter() - started
        stop.set()
        sampler.join()
        reader = RunReader(run_dir)
        metrics = reader.metrics()[1:]  # the first step pays the optimizer's state allocation
        events = reader.events()
        status = reader.status() or {}
        first_step_at = float(reader.metrics()[0]["time"])
        first_step = first_step_at - float(status.get("start_time", 0.0))
        first_step_from_launch = first_step_at - launched

    def median(key: str) -> float:
        return statistics.median(float(m.get(key, 0.0)) for m in metrics)

    def rest(m: dict) -> float:
        named = ("timing_trainer_step_total", "timing_waiting_for_data", "timing_weight_sync_total")
        return float(m["timing_step_total"]) - sum(float(m.get(k, 0.0)) for k in named)

    step, trainer = median("timing_step_total"), median("timing_trainer_step_total")
    waiting, sync = median("timing_waiting_for_data"), median("timing_weight_sync_total")
    rows = [
        ("step (orchestrator)", step),
        ("  trainer compute (forward, backward, optimizer)", trainer),
        ("    forward", median("timing_forward_total")),
        ("    backward", median("timing_backward_total")),
        ("    optimizer", median("timing_optimizer_total")),
        ("  waiting for rollouts", waiting),
        ("  weight sync (trainer -> server, memory transport)", sync),
        ("  rest: Ray call, batch assembly, metrics, recording", statistics.median(rest(m) for m in metrics)),
    ]
    server_side: dict[str, float] = defaultdict(float)
    for e in events:
        if e["kind"] in ("inference.queue", "inference.prefill", "inference.decode"):
            server_side[e["request_id"]] += float(e["duration_s"])
    overheads = [
        float(e["duration_s"]) - server_side[e["request_id"]]
        for e in events
        if e["kind"] == "inference.request" and e["request_id"] in server_side
    ]
    rewards = [float(e["duration_s"]) for e in events if e["kind"] == "reward.compute"]
    print(
        f"tiny:{args.model}, {args.steps} steps, max_tokens {args.max_tokens}; wall {wall:.1f} s, "
        f"first training step ended {first_step_from_launch:.1f} s after the command's launch "
        f"({first_step:.1f} s after the run's start_time)"
    )
    print(f"{before}\n{report('after')}")
    print("\nper step (median, ms)")
    for name, value in rows:
        print(f"  {name:<56}{value * 1000:>8.1f}")
    print("\nper request / sample (median, ms)")
    http = statistics.median(overheads) * 1000
    print(f"  {'HTTP + JSON + event loops (client time - server phases)':<56}{http:>8.2f}")
    print(f"  {'reward computation':<56}{statistics.median(rewards) * 1000:>8.2f}")
    print("\nstart-up (seconds after the run started: its status file's start_time)")
    zero = float(status.get("start_time", 0.0))
    for label, event in startup_phases(events):
        begin, end = event["start"] - zero, event["start"] + event["duration_s"] - zero
        print(f"  {label:<56}{begin:>6.1f} -> {end:.1f}")
    print(f"  {'first training step ended':<56}{first_step:>6.1f}")
    print(f"  {'(the command was launched at)':<56}{launched - zero:>6.1f}")
    print(f"\nCPU seconds per step by process (start-up included, {args.steps} steps)")
    for role, seconds in by_role(cpu):
        print(f"  {role:<56}{seconds / args.steps * 1000:>8.1f} ms")
    until_first = [snapshot for at, snapshot in history if at <= first_step_at]
    if until_first:
        roles = by_role(until_first[-1])
        total = sum(seconds for _, seconds in roles)
        print(f"\nCPU seconds until the first training step ended (sampled every 0.5 s): {total:.1f} s in all")
        for role, seconds in roles:
            print(f"  {role:<56}{seconds:>8.1f} s")


def by_role(cpu: dict[int, tuple[str, float]]) -> list[tuple[str, float]]:
    """CPU seconds summed by process role, the largest first."""
    sums: dict[str, float] = defaultdict(float)
    for role, seconds in cpu.values():
        sums[role] += seconds
    return sorted(sums.items(), key=lambda kv: -kv[1])


if __name__ == "__main__":
    main()
