"""``bench/bench_trainer_backends.py`` runs: one step of the tiny model through each backend, and prints every field.

No timing is asserted (figures depend on the machine): only that each backend's case
ran and reported what the bench documents, and that both trained on the same batch
from the same weights (float32: the same loss to rounding), so a bench that timed
something else than the training step, or a backend path that broke, fails here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_trainer_backends.py"


@pytest.mark.slow
def test_bench_runs_both_backends_on_the_same_step() -> None:
    command = [sys.executable, str(BENCH), "--size", "tiny", "--steps", "1", "--warmup", "0", "--recompute", "off"]
    done = subprocess.run([*command, "--json"], stdout=subprocess.PIPE, text=True, check=True, timeout=300)
    result = json.loads(done.stdout.strip().splitlines()[-1])

    assert result["device"] == "cpu" and result["precision"] == "fp32" and result["parameters"] > 0
    assert [(case["backend"], case["recompute"]) for case in result["cases"]] == [("fsdp", "off"), ("megatron", "off")]
    for case in result["cases"]:
        assert case["world_size"] == 1 and case["tokens_per_step"] == result["tokens_per_step"] > 0
        assert case["step_time_s"] > 0 and case["tokens_per_s"] > 0 and math.isfinite(case["loss"])
        assert len(case["peak_memory_mib"]) == 1 and case["peak_memory_mib"][0] > 0
        assert 0 <= case["step_memory_mib"][0] <= case["peak_memory_mib"][0]
    fsdp, megatron = result["cases"]
    assert megatron["loss"] == pytest.approx(fsdp["loss"], rel=1e-4)
