"""The CPU quick start (or another example with evals) over several seeds: wall time and held-out eval before/after RL.

Runs ``telescope run CONFIG --seed S`` for each seed (``--config``, default the quick
start ``configs/examples/countdown_tiny.yaml``; the agent example is
``configs/examples/cpu/countdown_agent_tiny.yaml``) and reports, per seed and as mean +-
standard deviation, its first eval's mean reward and correct rate before training (after
the warm start) and after the RL steps, and the run's wall time. Run by hand:
``python bench/bench_quickstart.py --seeds 0 1 2``.

A run whose held-out correct rate (or, with ``--keep-by reward``, mean reward: the
measure of wordle, whose correct rate counts any partial credit) gains less than
``--keep-below`` points (default 15) is kept: its run directory is moved to
``runs/bench_quickstart/`` (the path is printed), so that a run that did not learn can be looked at afterwards
(``telescope ui``, its metrics and rollouts). The others are deleted with the
temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cores_check import report

REPO = Path(__file__).resolve().parents[1]


QUICK_START = REPO / "configs" / "examples" / "countdown_tiny.yaml"


def run(seed: int, workdir: Path, extra: list[str], config: Path = QUICK_START) -> dict[str, float]:
    import yaml

    run_dir = workdir / f"seed{seed}"
    name = yaml.safe_load(config.read_text())["evals"][0]["name"]
    command = [
        sys.executable,
        "-c",
        "import sys; from telescope.cli.main import main; sys.exit(main(sys.argv[1:]))",
        "run",
        str(config),
        "--seed",
        str(seed),
        "--run_dir",
        str(run_dir),
        *extra,
    ]
    start = time.perf_counter()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "TELESCOPE_PROGRESS": "off"}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    evals = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines() if line]
    before = next(e["metrics"] for e in evals if e["phase"] == "before")
    after = next(e["metrics"] for e in evals if e["phase"] == "after")
    return {
        "wall_s": wall,
        "reward_before": before[f"eval/{name}/reward_mean"],
        "reward_after": after[f"eval/{name}/reward_mean"],
        "correct_before": before[f"eval/{name}/correct_rate"],
        "correct_after": after[f"eval/{name}/correct_rate"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", type=Path, default=QUICK_START, help="the example to run (it must have evals)")
    parser.add_argument(
        "--keep-below",
        dest="keep_below",
        type=float,
        default=15.0,
        help="keep the run directory of a run whose --keep-by metric gains fewer points than this",
    )
    parser.add_argument(
        "--keep-by",
        dest="keep_by",
        choices=("correct", "reward"),
        default="correct",
        help="the eval metric --keep-below judges: the correct rate, or the mean reward (wordle's measure)",
    )
    args, extra = parser.parse_known_args()
    print(report("before"), flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            results.append(run(seed, Path(tmp), extra, args.config))
            r = results[-1]
            print(
                f"seed {seed}: wall {r['wall_s']:.0f} s | reward {r['reward_before']:.3f} -> {r['reward_after']:.3f}"
                f" | correct {r['correct_before']:.3f} -> {r['correct_after']:.3f}",
                flush=True,
            )
            gain = 100 * (r[f"{args.keep_by}_after"] - r[f"{args.keep_by}_before"])
            if gain < args.keep_below:
                stamp = f"{args.config.stem}-seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
                kept = REPO / "runs" / "bench_quickstart" / stamp
                kept.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(Path(tmp) / f"seed{seed}"), kept)
                print(
                    f"  {args.keep_by} gained {gain:+.1f} points (< {args.keep_below:g}): run directory kept at {kept}",
                    flush=True,
                )
    for key in ("wall_s", "reward_before", "reward_after", "correct_before", "correct_after"):
        values = [r[key] for r in results]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{key:<15} mean {statistics.mean(values):.3f}  std {spread:.3f}")
    gains = [r["reward_after"] - r["reward_before"] for r in results]
    print(
        f"reward gain     mean {statistics.mean(gains):.3f}  std {statistics.stdev(gains) if len(gains) > 1 else 0:.3f}"
    )
    print(report("after"))


if __name__ == "__main__":
    main()
