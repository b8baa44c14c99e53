"""The private cluster ``connect_ray`` starts: no idle workers prestarted on the cores the run's start-up needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

#: Starts a private cluster the way a run does, then reports the raylet's Python workers.
SCRIPT = r"""
import json, sys, time
from pathlib import Path
import ray
from telescope.config.loader import load_config
from telescope.runtime.ray_cluster import connect_ray

config = load_config(None, {"environments": [{"name": "countdown"}], "ray_address": "local"},
                     check_plugins=False).config
assert connect_ray(config, Path(sys.argv[1]))
raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid


def workers():
    # the raylet's idle Python workers: default_worker.py until Ray renames them ray::IDLE (its agents are
    # ray::DashboardAgent and ray::RuntimeEnvAgent)
    found = []
    for pid in Path(f"/proc/{raylet}/task/{raylet}/children").read_text().split():
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if command.startswith("ray::IDLE") or "default_worker.py" in command:
            found.append(command.split(" ")[0])
    return found


deadline = time.monotonic() + 3.0  # a prestart is asked for as the driver registers: its processes fork at once
while time.monotonic() < deadline and not workers():
    time.sleep(0.1)
print(json.dumps({"workers": workers()}))
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
    assert workers == []


#: Starts a private cluster the way a run does, then reports what a worker task sees.
INHERIT_SCRIPT = r"""
import json, os, sys
from pathlib import Path
import ray
from telescope.config.loader import load_config
from telescope.runtime.ray_cluster import connect_ray

config = load_config(None, {"environments": [{"name": "countdown"}], "ray_address": "local"},
                     check_plugins=False).config
assert connect_ray(config, Path(sys.argv[1]))
after = os.environ.get("MALLOC_MMAP_THRESHOLD_")


@ray.remote
def seen():
    env = ray.get_runtime_context().runtime_env
    return {"runtime_env": {k: v for k, v in env.items() if v}, "mmap": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
            "python": sys.executable}


print(json.dumps({**ray.get(seen.remote()), "driver_after": after, "driver_python": sys.executable}))
ray.shutdown()
"""


def test_a_private_clusters_workers_inherit_the_runs_variables_without_a_runtime_env(tmp_path: Path) -> None:
    """No runtime environment to set up (Ray's setup_worker.py step), and the variables still arrive."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    for name in ("RAY_ADDRESS", "MALLOC_MMAP_THRESHOLD_"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", INHERIT_SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["runtime_env"] == {}
    assert seen["mmap"] == str(1 << 30)  # ray_worker_keep_freed_memory
    assert seen["python"] == seen["driver_python"]
    assert seen["driver_after"] is None  # the driver's own environment is as it was
