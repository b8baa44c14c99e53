"""The private cluster ``connect_ray`` starts: no idle workers prestarted on the cores the run's start-up needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

#: Starts a private cluster the way a run does, waits, then reports the raylet's worker processes.
SCRIPT = """
import json, os, sys, time
from pathlib import Path
import ray
from telescope.config.loader import load_config
from telescope.runtime.ray_cluster import connect_ray

config = load_config(None, {"environments": [{"name": "countdown"}], "ray_address": "local"},
                     check_plugins=False).config
assert connect_ray(config, Path(sys.argv[1]))
raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid
deadline = time.monotonic() + 4.0  # a prestart happens as the driver registers, well within this
while time.monotonic() < deadline:
    time.sleep(0.25)
children = Path(f"/proc/{raylet}/task/{raylet}/children").read_text().split()
names = []
for pid in children:
    try:
        names.append(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")[0].decode())
    except OSError:
        pass
print(json.dumps({"workers": [n for n in names if n.startswith("ray::")]}))
ray.shutdown()
"""


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads the raylet's children from /proc")
def test_a_private_cluster_prestarts_no_idle_workers(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    workers = json.loads(done.stdout.strip().splitlines()[-1])["workers"]
    # Ray's own agents are not "ray::" workers of the raylet's pool; prestarted ones show as ray::IDLE
    assert [w for w in workers if w.startswith("ray::IDLE")] == []
