"""Time ``load_config`` on a ~24 MB config (target: well under 10 s; a refusal under 5 s).

Writes, in a temporary folder, a valid run config padded to the requested size
with a long ``wandb_tags`` list (``--shape tags``) or a large ``kwargs`` mapping of
an environment entry (``--shape kwargs``), or a config with a long ``environments``
list (``--shape environments``: more entries than a config may list, so it is
refused), then loads it once and prints the wall time (and CPU time, steadier on a
busy machine), the process's peak resident memory and whether it was refused.
No assertions: run by hand
(``python bench/bench_config_load.py --mb 24``) and compare before and after a
change to the config reader.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path


def write_config(path: Path, megabytes: float, shape: str) -> int:
    """Write a valid config of about ``megabytes`` MB; returns the number of padding entries."""
    target = int(megabytes * 1_000_000)
    head = "environments:\n  - name: countdown\n    kwargs:\n      seed: 1\n"
    parts: list[str] = []
    size = len(head) + 40
    i = 0
    if shape == "environments":
        entry = "  - name: countdown\n    kwargs: {seed: 1}\n"
        count = max(1, (target - 40) // len(entry))
        path.write_text("seed: 3\nenvironments:\n" + entry * count, encoding="utf-8")
        return count
    while size < target:
        entry = f"        key_{i:08d}: value {i} of the padding\n" if shape == "kwargs" else f"  - tag-{i:08d}-x\n"
        parts.append(entry)
        size += len(entry)
        i += 1
    if shape == "kwargs":
        text = head + "      padding:\n" + "".join(parts) + "seed: 3\n"
    else:
        text = head + "seed: 3\nwandb_tags:\n" + "".join(parts)
    path.write_text(text, encoding="utf-8")
    return i


def peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e6 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=24.0, help="size of the generated config in MB")
    parser.add_argument("--shape", choices=("tags", "kwargs", "environments"), default="tags")
    args = parser.parse_args()

    from telescope.config.errors import ConfigError
    from telescope.config.loader import load_config  # imported before timing: only the load is measured

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.yaml"
        entries = write_config(path, args.mb, args.shape)
        size_mb = path.stat().st_size / 1e6
        before = peak_rss_mb()
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            outcome = f"loaded (seed {load_config(path, check_plugins=False).config.seed})"
        except ConfigError as exc:
            outcome = f"refused: {exc.problems[0][:120]}"
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    print(f"config: {size_mb:.1f} MB, {entries:,} {args.shape} entries; {outcome}")
    memory = f"peak RSS {peak_rss_mb():.0f} MB (before loading {before:.0f} MB)"
    print(f"load_config: {elapsed:.2f} s wall ({cpu:.2f} s CPU), {memory}")


if __name__ == "__main__":
    main()
