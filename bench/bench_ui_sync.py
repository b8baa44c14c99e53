"""Benchmark of ``telescope ui``: sync time of a large synthetic run and first-data latency per page.

The run (default: 5,000 steps x 200 metrics, 500,000 rollouts, 2,000,000 events, written
in the run store's formats with its own JSON Lines writer) is synced into a fresh DuckDB
file in one pass; then each page's first API call is timed in-process (no network), on a
cold server. Prints figures; asserts nothing. ``--scale 0.1`` for a quick look.

    python bench/bench_ui_sync.py [--scale 1.0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

from telescope.recording.run_store import JsonlWriter, RunStore


def make_run(run_dir: Path, steps: int, metrics: int, rollouts: int, events: int) -> None:
    rng = random.Random(0)
    store = RunStore(run_dir)
    store.write_config(
        f"number_of_steps: {steps}\n",
        {
            "number_of_steps": steps,
            "max_tokens": 512,
            "environments": [{"name": "countdown", "reward_min": 0.0, "reward_max": 2.0}],
        },
    )
    store.set_status("completed", step=steps)
    store.close()
    names = [f"section{i % 10}/group{i % 7}/metric{i}" for i in range(metrics - 3)] + [
        "reward/mean",
        "grad_norm",
        "timing_step_total",
    ]
    writer = JsonlWriter(run_dir / "metrics.jsonl")
    writer.write_many({"step": s, "time": 1e9 + s, **{n: rng.random() for n in names}} for s in range(steps))
    writer.close()
    per_step = max(1, rollouts // steps)
    text = "The answer is <answer>42</answer> because " + "reasoning " * 30
    writer = JsonlWriter(run_dir / "rollouts.jsonl")
    batch = []
    for i in range(rollouts):
        step, index = divmod(i, per_step)
        batch.append(
            {
                "step": step,
                "group_index": index // 8,
                "rollout_index": index % 8,
                "sample_id": f"s{i // 8}",
                "environment": "countdown",
                "prompt": f"numbers {i} -> {i % 97}",
                "completion": text + str(i),
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}],
                "reward": float(i % 3 == 0),
                "advantage": 0.1,
                "sample_metrics": {"correct": 1.0},
                "policy_version": step,
                "stop_reason": "stop",
                "num_turns": 1,
                "prompt_tokens": 20,
                "completion_tokens": 80,
                "total_tokens": 100,
                "error": None,
            }
        )
        if len(batch) == 10000:
            writer.write_many(batch)
            batch = []
    writer.write_many(batch)
    writer.close()
    kinds = [
        "inference.request",
        "orchestrator.group_dispatched",
        "reward.compute",
        "trainer.forward",
        "sandbox.execute",
    ]
    writer = JsonlWriter(run_dir / "events.jsonl")
    batch = []
    for i in range(events):
        kind = kinds[i % len(kinds)]
        batch.append(
            {
                "kind": kind,
                "start": 1e9 + i * steps / events,
                "duration_s": 0.05,
                "component": kind.split(".")[0],
                "server": i % 8,
                "step": int(i * steps / events),
                "request_id": i,
            }
        )
        if len(batch) == 20000:
            writer.write_many(batch)
            batch = []
    writer.write_many(batch)
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--keep", type=Path, default=None, help="write the run there and keep it")
    args = parser.parse_args()
    steps, metrics = int(5000 * args.scale), 200
    rollouts, events = int(500_000 * args.scale), int(2_000_000 * args.scale)
    work = Path(tempfile.mkdtemp(prefix="bench-ui-"))
    run_dir = (args.keep or work / "runs") / "big"
    try:
        if not (run_dir / "events.jsonl").exists():
            started = time.perf_counter()
            make_run(run_dir, steps, metrics, rollouts, events)
            print(
                f"wrote {steps} steps x {metrics} metrics, {rollouts} rollouts, {events} events "
                f"in {time.perf_counter() - started:.1f} s"
            )
        from fastapi.testclient import TestClient

        from telescope_ui_sync.server.app import create_app
        from telescope_ui_sync.sync.schema import connect
        from telescope_ui_sync.sync.syncer import SyncService, run_id_for

        con = connect(work / "ui.duckdb")
        started = time.perf_counter()
        result = SyncService(con.cursor(), [run_dir]).sync_all()
        elapsed = time.perf_counter() - started
        print(f"sync: {elapsed:.1f} s ({ {k: v for k, v in next(iter(result.values())).rows.items()} })")
        api = TestClient(create_app(con))
        rid = run_id_for(run_dir)
        calls = {
            "overview (summary)": ("/api/runs/" + rid, {}),
            "runs list": ("/api/runs", {}),
            "metrics catalog": ("/api/metrics/catalog", {"runs": rid}),
            "metrics series (10 charts)": (
                "/api/metrics/series",
                {
                    "runs": rid,
                    "names": ",".join(f"section0/group{g}/metric{g * 10}" for g in range(7))
                    + ",reward/mean,grad_norm,timing_step_total",
                },
            ),
            "rollouts steps": ("/api/rollouts/steps", {"run": rid}),
            "rollouts (one step)": ("/api/rollouts", {"run": rid}),
            "rollout sample": ("/api/rollouts/sample", {"run": rid, "seq": 12345}),
            "rollouts search": ("/api/rollouts/search", {"run": rid, "q": "numbers 4242 "}),
            "timeline (whole run)": ("/api/timeline", {"run": rid}),
            "timeline (1% window)": (
                "/api/timeline",
                {"run": rid, "start": 1e9 + steps / 2, "end": 1e9 + steps / 2 + steps / 100},
            ),
            "evals": ("/api/evals", {"run": rid}),
            "logs": ("/api/logs", {"run": rid}),
            "infra": ("/api/infra", {"run": rid}),
            "sandboxes": ("/api/sandboxes", {"run": rid}),
        }
        for name, (path, params) in calls.items():
            started = time.perf_counter()
            response = api.get(path, params=params)
            ms = (time.perf_counter() - started) * 1000
            print(f"  {name:28s} {ms:7.1f} ms  ({response.status_code}, {len(response.content) / 1024:.0f} KiB)")
        con.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
