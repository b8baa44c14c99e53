"""The reference trajectory: a short real run's per-step metrics must stay where they were committed.

``inprocess_run.run_reference`` trains the tiny ``test`` model for 6 GRPO steps on the
CPU (real engine, real ``fsdp`` trainer, the real orchestrator; synchronous,
``batch_assembly: deterministic``, seed 0; PPO clipping with two minibatches, so the
second minibatch's importance ratio and the inference KL are not trivially 1 and 0),
and ``trajectory.json`` holds its metrics per step. A change that moves the loop's
math (the loss, the advantages, the optimizer, the sampler, the log-probabilities,
packing, weight loading) moves them, and this test fails, naming each step and metric.

Tolerance: each value within ``REL_TOL`` relative or ``ABS_TOL`` absolute of the
committed one. Measured: three runs on one machine gave bit-identical metrics; a run
under torch's non-vectorised CPU kernels (``ATEN_CPU_CAPABILITY=default``, which rounds
as a CPU without AVX would) differed by at most 6.2e-5 relative (the loss near zero,
7e-8 absolute) and sampled the same tokens. ``REL_TOL`` is 1e-3, over ten times that;
a 10% change of the learning rate or of the clip range moves several metrics by far more.
Limit: on a CPU whose rounding changes a sampled token, the discrete metrics (rewards,
token counts) jump and the test fails; regenerate the reference there if that is the
cause, after checking that the math did not change.

Updating on purpose (a change meant to move the math, or new metrics)::

    TELESCOPE_UPDATE_REFERENCE=1 pytest tests/core/reference -q

rewrites ``trajectory.json`` from a fresh run (the test then reports itself skipped);
commit the file with the change and say why it moved.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from .inprocess_run import REFERENCE_ARGS, run_reference

REFERENCE = Path(__file__).with_name("trajectory.json")
UPDATE_VARIABLE = "TELESCOPE_UPDATE_REFERENCE"
REL_TOL = 1e-3
ABS_TOL = 1e-6
#: The metrics compared: the trainer's math and what it was fed. No timing or throughput (they vary run to run).
METRICS = (
    "loss",
    "grad_norm",
    "entropy",
    "kl_divergence_inference",
    "learning_rate",
    "reward/mean",
    "reward/std",
    "advantage/std",
    "tokens/completion/mean",
    "train/loss_tokens",
)


def trajectory(records: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The compared metrics of each step's record."""
    return [{"step": record["step"], **{name: record[name] for name in METRICS}} for record in records]


def departures(expected: list[dict[str, float]], measured: list[dict[str, float]]) -> list[str]:
    """Every step and metric of ``measured`` outside the tolerance of ``expected``, as readable lines."""
    if len(expected) != len(measured):
        return [f"{len(measured)} steps, the reference has {len(expected)}"]
    found = []
    for want, got in zip(expected, measured, strict=True):
        for name in ("step", *METRICS):
            if name not in want:
                found.append(f"step {got['step']}: {name} is not in the reference")
            elif not math.isclose(got[name], want[name], rel_tol=REL_TOL, abs_tol=ABS_TOL):
                found.append(f"step {want['step']}: {name} = {got[name]!r}, the reference has {want[name]!r}")
    return found


def test_departures_names_what_moved_beyond_the_tolerance() -> None:
    expected = [{"step": 0, **dict.fromkeys(METRICS, 1.0)}, {"step": 1, **dict.fromkeys(METRICS, 0.5)}]
    within = [dict(row) for row in expected]
    within[1]["loss"] = 0.5 * (1 + REL_TOL / 2)
    assert departures(expected, within) == []
    moved = [dict(row) for row in expected]
    moved[1]["grad_norm"] = 0.5 * (1 + 3 * REL_TOL)
    assert departures(expected, moved) == [f"step 1: grad_norm = {moved[1]['grad_norm']!r}, the reference has 0.5"]
    assert departures(expected, expected[:1]) == ["1 steps, the reference has 2"]


@pytest.mark.slow
def test_the_reference_run_follows_the_committed_trajectory(tmp_path: Path) -> None:
    measured = trajectory(run_reference(tmp_path / "run"))
    if os.environ.get(UPDATE_VARIABLE) == "1":
        document = {
            "about": "per-step metrics of tests/core/reference/inprocess_run.py's run; see test_trajectory.py",
            "update": f"{UPDATE_VARIABLE}=1 pytest tests/core/reference -q",
            "config": REFERENCE_ARGS,
            "rel_tol": REL_TOL,
            "abs_tol": ABS_TOL,
            "steps": measured,
        }
        REFERENCE.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        pytest.skip(f"{UPDATE_VARIABLE}=1: wrote {REFERENCE}; commit it with the change that moved it")
    reference = json.loads(REFERENCE.read_text(encoding="utf-8"))
    assert reference["config"] == REFERENCE_ARGS, (
        f"the reference run's config changed: update the reference on purpose ({UPDATE_VARIABLE}=1)"
    )
    moved = departures(reference["steps"], measured)
    assert not moved, (
        "the reference run left its committed trajectory "
        f"(rel {REL_TOL}, abs {ABS_TOL}); if the change is meant, rerun with {UPDATE_VARIABLE}=1:\n  "
        + "\n  ".join(moved)
    )
