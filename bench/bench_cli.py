"""Start-up time of the light commands (target: well under a second each).

Runs each command several times in a fresh interpreter and prints the median and
worst wall time. Run by hand (``python bench/bench_cli.py``) or ``nox -s bench``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = str(REPO / "configs" / "examples" / "example_countdown.yaml")
COMMANDS = {
    "telescope --help": ["--help"],
    "telescope plugins": ["plugins"],
    "telescope config validate": ["config", "validate", EXAMPLE],
    "telescope config show": ["config", "show", EXAMPLE],
}
TARGET_S = 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args, _ = parser.parse_known_args()
    telescope = Path(sys.executable).parent / "telescope"
    print(f"{'command':<30} {'median s':>9} {'max s':>7}  target < {TARGET_S:.1f} s")
    for label, argv in COMMANDS.items():
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            subprocess.run([str(telescope), *argv], capture_output=True, check=True)
            times.append(time.perf_counter() - t0)
        verdict = "ok" if max(times) < TARGET_S else "SLOW"
        print(f"{label:<30} {statistics.median(times):>9.3f} {max(times):>7.3f}  {verdict}")


if __name__ == "__main__":
    main()
