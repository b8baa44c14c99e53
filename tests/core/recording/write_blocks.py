"""A run store writer in its own process (for the concurrent-reader and kill -9 tests).

Usage: python write_blocks.py RUN_DIR COUNT BLOCK_SECONDS FLUSH_SECONDS ROLLOUT_BLOCK PAUSE_S

Emits events ``test.tick`` numbered ``i`` = 0, 1, ... (COUNT of them, or until killed when
COUNT is -1) through the event bus, and every 10th event logs two rollouts numbered ``n``.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

from telescope.api import events
from telescope.recording.run_store import RunStore


def main() -> None:
    run_dir, count, block_s, flush_s, rollout_block, pause = (
        Path(sys.argv[1]),
        int(sys.argv[2]),
        float(sys.argv[3]),
        float(sys.argv[4]),
        int(sys.argv[5]),
        float(sys.argv[6]),
    )
    store = RunStore(
        run_dir,
        event_block_duration_seconds=block_s,
        event_upload_interval_seconds=flush_s,
        rollout_block_size=rollout_block,
    )
    store.capture_events()
    numbers = range(count) if count >= 0 else itertools.count()
    for i in numbers:
        events.emit("test.tick", i=i, step=i // 10, component="writer", payload="x" * 40)
        if i % 10 == 9:
            store.log_rollouts(i // 10, [{"n": 2 * (i // 10) + k, "completion": "y" * 300} for k in range(2)])
        if pause:
            time.sleep(pause)
    store.close()


if __name__ == "__main__":
    main()
