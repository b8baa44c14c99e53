"""What recording costs a training step: 1M events and 100k rollouts through the real run store.

A simulated training loop runs steps of a fixed CPU matmul workload (about ``--step-seconds``
each, single-threaded BLAS) on the main thread. Each step it does what the orchestrator's
recorder does: it logs the step's rollouts (``--rollouts / on-steps`` realistic records:
~0.5 KB prompt, ~1.2 KB completion, chat messages, sample metrics), the step's metrics and
the run status, and times its trainer phase with ``events.timed``. Meanwhile ``--emitters``
threads emit inference, sandbox and reward events through ``events.emit`` at the rate that
writes ``--events`` events over the recorded steps (like inference clients and sandboxes).

Phases alternate (off, on, off, on, ...) so that drift of a shared machine hits both: in an
*on* phase the run store is subscribed to the event bus and the loop logs to it; in an
*off* phase the same threads emit to no sink and the loop builds the same records but logs
nothing. Before each off phase the store is flushed outside the timings, so an on phase's
backlog never slows an off phase. It reports the mean and median step time of each mode
and the overhead, the writer thread's throughput, bytes on disk (Parquet blocks against
the same records as JSON Lines) and reader times (full scans, kind filter, the live tail,
a cursor poll, one step's rollouts). No assertions; run it by hand::

    python bench/bench_recording.py      # 1M events, 100k rollouts over 300 recorded 1 s steps
    python bench/bench_recording.py --events 100000 --rollouts 10000 --steps 40 --phases 4   # quick

The default rate (3,300 events/s and 333 rollouts a second-long step, 2.5 KB-4 KB each) is
that of a large run; ``--steps 100`` makes it a 3x stress test. Phases are short (5 steps
each way) so that the load of a shared machine changes little between them.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before numpy: the step is one core's work
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

from telescope.api import events
from telescope.recording.block_writer import BlockStream
from telescope.recording.jsonl import dumps_line
from telescope.recording.run_reader import RunReader
from telescope.recording.run_store import RunStore

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "from",
    "or",
    "at",
    "an",
    "which",
    "we",
    "can",
]


def text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


def rollout_pool(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Distinct realistic rollout records (``rollout_record``'s fields)."""
    rng = random.Random(seed)
    pool = []
    for i in range(n):
        prompt = text(rng, rng.randint(300, 700))
        completion = text(rng, rng.randint(800, 1600))
        pool.append(
            {
                "group_index": i // 8,
                "rollout_index": i % 8,
                "sample_id": f"sample-{i}",
                "environment": "countdown",
                "prompt": prompt,
                "completion": completion,
                "messages": [
                    {"role": "system", "content": "Solve it."},
                    {"role": "user", "content": prompt},
                    {"role": "assistant", "content": completion},
                ],
                "reward": rng.random(),
                "advantage": rng.gauss(0, 1),
                "sample_metrics": {"correct": float(rng.random() > 0.5), "format": 1.0, "length_penalty": rng.random()},
                "policy_version": 3,
                "policy_versions": [3],
                "stop_reason": "stop",
                "num_turns": 1,
                "prompt_tokens": len(prompt) // 4,
                "completion_tokens": len(completion) // 4,
                "total_tokens": (len(prompt) + len(completion)) // 4,
                "error": None,
            }
        )
    return pool


class Emitters:
    """Threads that emit events at ``rate`` per second in total (to whatever is subscribed)."""

    def __init__(self, threads: int, rate: float, budget: int) -> None:
        self.rate_per_thread = rate / threads
        self.budget = budget  # events to emit while recording; then they idle through the on phases
        self.recording = False
        self.recorded = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(t,), daemon=True) for t in range(threads)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def _run(self, thread: int) -> None:
        rng = random.Random(thread)
        burst = 20
        next_time = time.perf_counter()
        n = 0
        while not self.stop.is_set():
            now = time.time()
            if self.recording:
                if self.recorded >= self.budget:
                    time.sleep(0.01)
                    continue
                self.recorded += burst  # (unlocked: may overshoot by a burst a thread)
            for _ in range(burst):
                n += 1
                choice = n % 10
                if choice < 6:
                    events.emit(
                        "inference.request",
                        start=now - 0.8,
                        duration_s=0.8,
                        component="orchestrator",
                        server=n % 8,
                        request_id=f"{thread}-{n}",
                        sample_id=f"sample-{n % 5000}",
                        group_id=n // 64,
                        prompt_tokens=rng.randint(100, 400),
                        completion_tokens=rng.randint(100, 1000),
                    )
                elif choice < 8:
                    events.emit(
                        "sandbox.execute",
                        start=now - 0.2,
                        duration_s=0.2,
                        component="sandbox",
                        command="python solution.py",
                        exit_code=0,
                        sandbox_id=f"sb-{n % 64}",
                    )
                else:
                    events.emit("reward.score", start=now, duration_s=0.001, sample_id=f"sample-{n % 5000}", reward=0.5)
            next_time += burst / self.rate_per_thread  # (the main thread adjusts the rate)
            delay = next_time - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            else:
                next_time = time.perf_counter()


def calibrate(seconds: float, size: int) -> tuple[np.ndarray, int]:
    matrix = np.random.default_rng(0).standard_normal((size, size))
    trials = []
    for _ in range(10):  # the fastest trial: the machine's speed when nothing else runs
        start = time.perf_counter()
        matrix @ matrix
        trials.append(time.perf_counter() - start)
    return matrix, max(1, round(seconds / min(trials)))


def timed_ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return (time.perf_counter() - start) * 1000, value


def dir_bytes(path: Path, suffix: str) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.name.endswith(suffix))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=300, help="recorded steps")
    parser.add_argument("--phases", type=int, default=60, help="on/off phase pairs")
    parser.add_argument("--off-steps", type=int, default=5, help="unrecorded steps a phase")
    parser.add_argument("--step-seconds", type=float, default=1.0)
    parser.add_argument("--emitters", type=int, default=4)
    parser.add_argument("--matrix", type=int, default=1024, help="matmul size (the step's GIL-free work)")
    parser.add_argument("--block-seconds", type=float, default=120.0, help="event_block_duration_seconds")
    parser.add_argument("--flush-seconds", type=float, default=5.0, help="event_upload_interval_seconds")
    parser.add_argument("--rollout-block", type=int, default=500)
    parser.add_argument("--dir", type=Path, default=None, help="run directory (default: a temporary one)")
    args = parser.parse_args()

    per_step_rollouts = args.rollouts // args.steps
    steps_per_phase = args.steps // args.phases
    pool = rollout_pool(min(per_step_rollouts * 2, 4000))
    matrix, matmuls = calibrate(args.step_seconds, args.matrix)
    tmp = tempfile.TemporaryDirectory() if args.dir is None else None
    run_dir = Path(tmp.name) if tmp else args.dir
    store = RunStore(
        run_dir,
        event_block_duration_seconds=args.block_seconds,
        event_upload_interval_seconds=args.flush_seconds,
        rollout_block_size=args.rollout_block,
    )
    writer_time = {"s": 0.0}
    for stream in (store._events, store._rollouts):  # time the writer's flushes (throughput)
        _time_flushes(stream, writer_time)
    emitters = Emitters(args.emitters, args.events / (args.steps * args.step_seconds), args.events)
    emitters.start()
    times: dict[str, list[float]] = {"off": [], "on": []}
    calls: list[float] = []  # the training thread's own recording calls
    step = 0
    run_start = time.perf_counter()
    for phase in range(2 * args.phases):
        mode = "off" if phase % 2 == 0 else "on"
        unsubscribe = store.capture_events() if mode == "on" else None
        emitters.recording = mode == "on"
        for _ in range(steps_per_phase if mode == "on" else args.off_steps):
            start = time.perf_counter()
            with events.timed("trainer.step", step=step, rank=0):
                for _ in range(matmuls):
                    matrix @ matrix
            base = (step * per_step_rollouts) % len(pool)
            records = [
                {**pool[(base + i) % len(pool)], "step": step, "sample_id": f"s{step}-{i}"}
                for i in range(per_step_rollouts)
            ]
            if mode == "on":
                calls_start = time.perf_counter()
                store.log_rollouts(step, records)
                store.log_metrics(step, {"loss": 0.1, "reward/mean": 0.5, "timing_step_total": 1.0})
                store.set_status("running", step=step + 1)
                calls.append(time.perf_counter() - calls_start)
            times[mode].append(time.perf_counter() - start)
            step += 1
        if mode == "off":  # emit the rest of the budget over the remaining recorded steps at this speed
            on_left = args.steps - len(times["on"])
            step_time = statistics.mean(times["off"][-args.off_steps :])
            left = max(args.events - emitters.recorded, 0)
            emitters.rate_per_thread = max(left / max(on_left * step_time, 1e-3), 1.0) / args.emitters
        if unsubscribe is not None:
            emitters.recording = False
            unsubscribe()
            store.flush()  # outside the timings: the next off phase starts with no backlog
    run_seconds = time.perf_counter() - run_start
    emitters.close()
    store.flush()

    reader = RunReader(run_dir)
    live: dict[str, float] = {}
    live["event tail, 60 s (live, from the open block)"], tail = timed_ms(lambda: reader.event_tail(60))
    _, (_, cursor) = timed_ms(lambda: reader.read_events_since(None, kind="no-such-kind"))
    live["cursor poll, nothing new (live)"], _ = timed_ms(lambda: reader.read_events_since(cursor))
    close_ms, _ = timed_ms(store.close)
    reads: dict[str, float] = {}
    reads["events: full scan to dicts"], all_events = timed_ms(reader.events)
    reads["events: kind filter 'sandbox'"], sandbox = timed_ms(lambda: reader.events("sandbox"))
    reads["events: time range, last 60 s"], recent = timed_ms(lambda: reader.events(since=time.time() - 60))
    reads["rollouts: full scan to dicts"], all_rollouts = timed_ms(reader.rollouts)
    reads["rollouts: one step"], one_step = timed_ms(lambda: reader.rollouts(step=step - 1))
    parquet_events = dir_bytes(run_dir / "events", ".parquet")
    parquet_rollouts = dir_bytes(run_dir / "rollouts", ".parquet")
    jsonl_events = sum(len(dumps_line(e).encode()) for e in all_events)
    jsonl_rollouts = sum(len(dumps_line(r).encode()) for r in all_rollouts)

    off, on = times["off"], times["on"]
    overhead_mean = (statistics.mean(on) / statistics.mean(off) - 1) * 100
    overhead_median = (statistics.median(on) / statistics.median(off) - 1) * 100
    n_events, n_rollouts = len(all_events), len(all_rollouts)
    rows = [
        ("steps off / on", f"{len(off)} / {len(on)} ({matmuls} matmuls of {args.matrix}² a step, {run_seconds:.0f} s)"),
        ("step time off: mean / median", f"{statistics.mean(off):.4f} s / {statistics.median(off):.4f} s"),
        ("step time on:  mean / median", f"{statistics.mean(on):.4f} s / {statistics.median(on):.4f} s"),
        ("overhead: mean / median", f"{overhead_mean:+.2f} % / {overhead_median:+.2f} %"),
        ("recording calls on the step's thread", f"{statistics.mean(calls) * 1000:.2f} ms a step (mean)"),
        ("events / rollouts written", f"{n_events:,} / {n_rollouts:,} (dropped {store.dropped_events})"),
        ("writer thread busy", f"{writer_time['s']:.1f} s of {run_seconds:.0f} s"),
        ("writer throughput", f"{(n_events + n_rollouts) / max(writer_time['s'], 1e-9):,.0f} records/s busy"),
        ("close (seal last blocks)", f"{close_ms:.0f} ms"),
        (
            "events on disk: Parquet / JSONL",
            f"{parquet_events / 1e6:.1f} MB / {jsonl_events / 1e6:.1f} MB "
            f"({jsonl_events / max(parquet_events, 1):.1f}x)",
        ),
        (
            "rollouts on disk: Parquet / JSONL",
            f"{parquet_rollouts / 1e6:.1f} MB / {jsonl_rollouts / 1e6:.1f} MB "
            f"({jsonl_rollouts / max(parquet_rollouts, 1):.1f}x)",
        ),
        (
            "event blocks / rollout blocks",
            f"{len(list((run_dir / 'events').glob('block-*')))} / {len(list((run_dir / 'rollouts').glob('block-*')))}",
        ),
    ]
    counts = {
        "event tail, 60 s (live, from the open block)": len(tail),
        "events: full scan to dicts": n_events,
        "events: kind filter 'sandbox'": len(sandbox),
        "events: time range, last 60 s": len(recent),
        "rollouts: full scan to dicts": n_rollouts,
        "rollouts: one step": len(one_step),
        "cursor poll, nothing new (live)": 0,
    }
    rows += [(f"read {name}", f"{ms:,.1f} ms ({counts[name]:,} records)") for name, ms in {**live, **reads}.items()]
    width = max(len(name) for name, _ in rows)
    print(f"run store benchmark ({sys.platform}, {os.cpu_count()} cpus, run dir {run_dir})")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    if tmp:
        tmp.cleanup()


def _time_flushes(stream: BlockStream, total: dict[str, float]) -> None:
    original = stream.flush

    def flush() -> None:
        start = time.perf_counter()
        original()
        total["s"] += time.perf_counter() - start

    stream.flush = flush  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
