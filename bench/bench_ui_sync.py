"""Benchmark of ``telescope ui``: sync time of a large synthetic run and first-data latency per page.

The run (default: 5,000 steps x 200 metrics, 500,000 rollouts, 2,000,000 events, of them
1% ``infra.*`` samples) is written by the real :class:`~telescope.recording.run_store.RunStore`
with its default block settings (rollouts in blocks of 500, events in blocks of 30 minutes
of a run whose steps take 30 s: about 1,000 and 90 sealed Parquet blocks), under a fake
clock so that blocks are cut as in a real run. It is synced into a fresh DuckDB file in
one pass (timed), then one more step is appended and the next, incremental pass is timed.
Then each page's first API call is timed in-process (no network) on a freshly opened
connection to the synced file (what a restarted ``telescope ui`` serves first), and once
more (warm). Prints figures; asserts nothing. ``--scale 0.1`` for a quick look.

    python bench/bench_ui_sync.py [--scale 1.0] [--keep DIR]

``--keep DIR`` writes the run under DIR and reuses it on the next call (writing the full
run takes a few minutes).

The issue's targets: sync < 60 s, every page's first data < 500 ms. Current figures:
``bench/README.md``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from telescope.recording.jsonl import JsonlWriter
from telescope.recording.run_store import RunStore

STEP_SECONDS = 30.0
T0 = 1.7e9
KINDS = ("inference.request", "orchestrator.group_dispatched", "reward.compute", "trainer.forward", "sandbox.execute")
TEXT = "The answer is <answer>42</answer> because " + "reasoning " * 30


def metric_names(count: int) -> list[str]:
    return [f"section{i % 10}/group{i % 7}/metric{i}" for i in range(count - 3)] + [
        "reward/mean",
        "grad_norm",
        "timing_step_total",
    ]


def rollout(i: int, step: int, index: int) -> dict[str, Any]:
    return {
        "step": step,
        "group_index": index // 8,
        "rollout_index": index % 8,
        "sample_id": f"s{i // 8}",
        "environment": "countdown",
        "prompt": f"numbers {i} -> {i % 97}",
        "completion": TEXT + str(i),
        "messages": [
            {"role": "user", "content": f"numbers {i} -> {i % 97}"},
            {"role": "assistant", "content": TEXT + str(i)},
            {"role": "tool", "content": f"exit code {i % 3}"},
        ],
        "reward": float(i % 3 == 0),
        "advantage": 0.1,
        "sample_metrics": {"correct": float(i % 3 == 0), "format": 1.0},
        "policy_version": step,
        "policy_versions": [step],
        "stop_reason": "stop",
        "num_turns": 1,
        "prompt_tokens": 20,
        "completion_tokens": 80,
        "total_tokens": 100,
        "error": None,
    }


def event(i: int, start: float, step: int) -> dict[str, Any]:
    if i % 100 == 99:
        return {
            "kind": "infra.system",
            "start": start,
            "duration_s": 0.0,
            "component": "system",
            "node": f"node-{i % 4}",
            "cpu_utilization_percent": float(i % 100),
            "system_memory_used_gb": 12.5,
            "load_avg_1m": 1.5,
        }
    kind = KINDS[i % len(KINDS)]
    return {
        "kind": kind,
        "start": start,
        "duration_s": 0.05 + (i % 13) * 0.1,
        "component": kind.split(".")[0],
        "node": "node-0",
        "server": i % 8,
        "step": step,
        "request_id": f"r{i}",
        "prompt_tokens": 20,
    }


def make_run(run_dir: Path, steps: int, metrics: int, rollouts: int, events: int, first_step: int = 0) -> None:
    """Write (or, with ``first_step``, append to) the synthetic run through the real run store."""
    rng = random.Random(first_step)
    now = [T0 + first_step * STEP_SECONDS]
    store = RunStore(run_dir, clock=lambda: now[0])
    if first_step == 0:
        store.write_config(
            f"number_of_steps: {steps}\n",
            {
                "number_of_steps": steps,
                "max_tokens": 512,
                "environments": [{"name": "countdown", "reward_min": 0.0, "reward_max": 2.0}],
            },
        )
    store.close()  # metrics through a plain writer (one line per step, as the store writes them)
    names = metric_names(metrics)
    writer = JsonlWriter(run_dir / "metrics.jsonl")
    for s in range(first_step, first_step + steps):
        writer.write({"step": s, "time": T0 + (s + 1) * STEP_SECONDS, **{n: rng.random() for n in names}})
    writer.close()
    store = RunStore(run_dir, clock=lambda: now[0])
    per_step = max(1, rollouts // steps)
    events_per_step = max(1, events // steps)
    first_event = first_step * events_per_step
    for s in range(first_step, first_step + steps):
        base = s * per_step
        store.log_rollouts(s, [rollout(base + k, s, k) for k in range(per_step)])
        for k in range(events_per_step):
            i = first_event + (s - first_step) * events_per_step + k
            start = T0 + s * STEP_SECONDS + k * STEP_SECONDS / events_per_step
            store.log_event(event(i, start, s))
        now[0] = T0 + (s + 1) * STEP_SECONDS
        store.set_status("running", step=s + 1)
        if s % 10 == 9:
            store.flush()
    store.set_status("completed", step=first_step + steps)
    store.close()


def page_calls(rid: str, steps: int) -> dict[str, tuple[str, dict[str, Any]]]:
    names = [f"section0/group{g}/metric{g * 10}" for g in range(7)] + ["reward/mean", "grad_norm", "timing_step_total"]
    mid = T0 + steps * STEP_SECONDS / 2
    return {
        "runs list": ("/api/runs", {}),
        "overview (summary)": ("/api/runs/" + rid, {}),
        "metrics catalog": ("/api/metrics/catalog", {"runs": rid}),
        "metrics series (10 charts)": ("/api/metrics/series", {"runs": rid, "names": ",".join(names)}),
        "rollouts steps": ("/api/rollouts/steps", {"run": rid}),
        "rollouts (one step)": ("/api/rollouts", {"run": rid}),
        "rollout sample": ("/api/rollouts/sample", {"run": rid, "seq": 12345 % max(1, steps * 100)}),
        "rollouts search": ("/api/rollouts/search", {"run": rid, "q": "numbers 4242 "}),
        "rollouts search (rare)": ("/api/rollouts/search", {"run": rid, "q": "no such text anywhere"}),
        "timeline (whole run)": ("/api/timeline", {"run": rid}),
        "timeline (1% window)": (
            "/api/timeline",
            {"run": rid, "start": mid, "end": mid + steps * STEP_SECONDS / 100},
        ),
        "evals": ("/api/evals", {"run": rid}),
        "logs": ("/api/logs", {"run": rid}),
        "infra": ("/api/infra", {"run": rid}),
        "sandboxes": ("/api/sandboxes", {"run": rid}),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--keep", type=Path, default=None, help="write the run there and keep it (reused next time)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    steps, metrics = int(5000 * args.scale), 200
    rollouts, events = int(500_000 * args.scale), int(2_000_000 * args.scale)
    work = Path(tempfile.mkdtemp(prefix="bench-ui-"))
    source = (args.keep or work / "source") / f"big-{args.scale:g}"
    run_dir = work / "runs" / "big"
    figures: dict[str, Any] = {
        "scale": args.scale,
        "steps": steps,
        "metrics": metrics,
        "rollouts": rollouts,
        "events": events,
    }
    try:
        if not (source / "status.json").exists():
            started = time.perf_counter()
            make_run(source, steps, metrics, rollouts, events)
            print(
                f"wrote {steps} steps x {metrics} metrics, {rollouts} rollouts, {events} events "
                f"in {time.perf_counter() - started:.1f} s"
            )
        shutil.copytree(source, run_dir)  # the incremental pass appends to the copy
        from fastapi.testclient import TestClient

        from telescope_ui_sync.server.app import create_app
        from telescope_ui_sync.sync.schema import connect
        from telescope_ui_sync.sync.syncer import SyncService, run_id_for

        db = work / "ui.duckdb"
        con = connect(db)
        service = SyncService(con.cursor(), [run_dir])
        started, cpu = time.perf_counter(), time.process_time()
        result = service.sync_all()
        figures["sync_s"] = elapsed = time.perf_counter() - started
        figures["sync_cpu_s"] = cpu = time.process_time() - cpu
        print(
            f"sync: {elapsed:.1f} s, CPU {cpu:.1f} s ({ {k: v for k, v in next(iter(result.values())).rows.items()} })"
        )

        make_run(run_dir, 1, metrics, rollouts // steps, events // steps, first_step=steps)
        started, cpu = time.perf_counter(), time.process_time()
        result = service.sync_all()
        figures["incremental_sync_s"] = elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        print(
            f"incremental pass (one more step): {elapsed * 1000:.0f} ms, CPU {cpu * 1000:.0f} ms "
            f"({next(iter(result.values())).rows})"
        )
        con.close()
        figures["db_mib"] = db.stat().st_size / 2**20
        print(f"database: {figures['db_mib']:.0f} MiB")

        con = connect(db)  # what a restarted server opens
        api = TestClient(create_app(con), base_url="http://localhost")
        rid = run_id_for(run_dir)
        figures["pages_ms"], figures["pages_cpu_ms"] = {}, {}
        print(f"  {'page API (first call, cold)':28s} {'wall ms':>8s} {'CPU ms':>7s}   {'2nd call':>8s}")
        for name, (path, params) in page_calls(rid, steps).items():
            timings = []
            for _ in range(2):
                started, cpu = time.perf_counter(), time.process_time()
                response = api.get(path, params=params)
                timings.append(((time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000))
            figures["pages_ms"][name], figures["pages_cpu_ms"][name] = timings[0]
            print(
                f"  {name:28s} {timings[0][0]:8.1f} {timings[0][1]:7.1f}   {timings[1][0]:8.1f}  "
                f"({response.status_code}, {len(response.content) / 1024:.0f} KiB)"
            )
        con.close()
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
