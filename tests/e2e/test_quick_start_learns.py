"""The README's main command learns: held-out reward rises over the RL steps.

Runs the CPU quick start (`configs/examples/countdown_tiny.yaml`) as it ships and
compares the held-out eval after training with the eval before training (which runs
after the supervised warm start, so the gain is the RL steps'). Measured over seeds
0, 1, 2 with bench/bench_quickstart.py; the margin asserted here is well below the
smallest gain measured.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from telescope.recording.run_reader import RunReader

REPO = Path(__file__).resolve().parents[2]
# Eval reward (0..2) the RL steps must add, at least, on the 256 held-out problems. Measured with the
# quick start as it then shipped (300-step warm start at 3e-3, 300 RL steps keeping zero-advantage groups), one run
# per seed on 2026-11-25: +0.168 (seed 0), +0.195 (seed 1), +0.184 (seed 2); the correct rate +16,
# +17 and +18 points (issue 14's bar is 15). Again after the sampler's change to an inverse
# transform, the same day: +0.199, +0.223, +0.156 (+18, +21 and +16 points); on 2026-11-26, with
# a group's identical prompts prefilled once: +0.180, +0.195, +0.164 (+17, +19, +17); later that day,
# with batched requests: +0.125, +0.316, +0.188 (+12.5, +30.5, +17.6), seed 0 +0.13 to +0.15 in five
# runs (+12.5 to +14.8 points: short of the bar on that seed). With 16 prompts a step (the quick start
# since): +0.207 and +0.195 (seed 0, two runs), +0.309 (seed 1), +0.266 (seed 2). Runs that do not
# learn (a 200-step warm start, an RL learning rate of 1e-3) stayed below +0.02. In a later session that
# day the 3e-3 warm start left seed 1 on its loss plateau (+0.02: 2% correct before RL and after); the
# quick start since (a 160-step warm start at 1.5e-3): +0.235, +0.336, +0.278 (+19.9, +30.9, +24.2
# points). The eval's own noise on a before/after difference is about 0.035 at 256 problems.
MARGIN = 0.10


def _megatron_installed() -> bool:
    import importlib.util

    return (
        importlib.util.find_spec("telescope_megatron") is not None and importlib.util.find_spec("megatron") is not None
    )


# The megatron variant is opt-in (TELESCOPE_E2E_MEGATRON=1) to keep CI's time: it passed on 2026-11-25 with the
# quick start as shipped (held-out correct rate 48% -> 68%, reward 1.457 -> 1.676, 377 s while CI ran beside it);
# megatron-core's attention takes an explicit mask and no shared prompts, so its steps cost more than FSDP's.
MEGATRON = pytest.param(
    "megatron",
    marks=[
        pytest.mark.skipif(not _megatron_installed(), reason="telescope-megatron is not installed"),
        pytest.mark.skipif(os.environ.get("TELESCOPE_E2E_MEGATRON") != "1", reason="set TELESCOPE_E2E_MEGATRON=1"),
        pytest.mark.timeout(2400),
    ],
)


@pytest.mark.slow
@pytest.mark.exclusive  # asserts learning, measured on 2 free cores
@pytest.mark.parametrize("backend", ["fsdp", MEGATRON])
def test_quick_start_reward_rises(tmp_path: Path, backend: str) -> None:
    """The quick start as it ships, and with ``--train_backend megatron`` (TP 1, no recomputation as the FSDP run)."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "TELESCOPE_PROGRESS": "lines"}
    command = [
        sys.executable,
        "-c",
        "import sys; from telescope.cli.main import main; sys.exit(main(sys.argv[1:]))",
        "run",
        str(REPO / "configs" / "examples" / "countdown_tiny.yaml"),
        "--run_dir",
        str(run_dir),
        "--inference_base_port",
        "8241",
        "--train_backend",
        backend,
    ]
    if backend == "megatron":
        command += ["--megatron_gradient_checkpointing", "false"]  # the quick start sets gradient_checkpointing: false
    result = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=900 if backend == "fsdp" else 2300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    evals = {e["phase"]: e["metrics"] for e in RunReader(run_dir).evals()}
    before = evals["before"]["eval/countdown/reward_mean"]
    after = evals["after"]["eval/countdown/reward_mean"]
    assert after >= before + MARGIN, (before, after)
