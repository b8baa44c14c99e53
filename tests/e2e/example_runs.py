"""Run a shipped example config through ``telescope run`` as a user would, for the learning e2e tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_example(config: str, run_dir: Path, port: int, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``telescope run configs/<config>`` on a private local Ray, its servers from ``port``; the finished process."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "TELESCOPE_PROGRESS": "lines"}
    command = [
        sys.executable,
        "-c",
        "import sys; from telescope.cli.main import main; sys.exit(main(sys.argv[1:]))",
        "run",
        str(REPO / "configs" / config),
        "--run_dir",
        str(run_dir),
        "--ray_address",
        "local",
        "--inference_base_port",
        str(port),
    ]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout_s)
