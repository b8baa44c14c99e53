"""A run killed (SIGKILL) after a checkpoint resumes without skipping or repeating a prompt."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from telescope.recording.run_liveness import run_state
from telescope.recording.run_reader import RunReader

SCRIPT = Path(__file__).with_name("run_fake_loop.py")


def run(run_dir: Path, steps: int, every: int, mode: str, delay: float = 0.0) -> subprocess.Popen[bytes]:
    args = [sys.executable, str(SCRIPT), str(run_dir), str(steps), str(every), mode, str(delay)]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def prompts_by_step(run_dir: Path) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for record in RunReader(run_dir).rollouts():
        out.setdefault(record["step"], []).append(record["sample_id"])
    return out


@pytest.mark.slow
def test_killed_run_resumes_exactly(tmp_path: Path) -> None:
    straight = run(tmp_path / "straight", 8, 0, "fresh")
    assert straight.wait(timeout=300) == 0, straight.stderr.read() if straight.stderr else ""

    killed_dir = tmp_path / "killed"
    victim = run(killed_dir, 8, 3, "fresh", delay=0.3)  # slow enough to be killed mid-run
    checkpoint = killed_dir / "checkpoints" / "step_00000003" / "meta.json"
    deadline = time.monotonic() + 240
    while not checkpoint.exists():
        assert victim.poll() is None, "the run ended before its checkpoint"
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    victim.kill()  # SIGKILL: no cleanup at all
    victim.wait(timeout=60)
    steps_before_kill = {r["step"] for r in RunReader(killed_dir).rollouts()}
    assert max(steps_before_kill) < 7, "the run finished before it was killed"
    killed_status = RunReader(killed_dir).status()
    assert killed_status is not None and killed_status["status"] == "running"  # what it last wrote
    assert run_state(killed_status).status == "died"  # what a reader shows

    resumed = run(killed_dir, 8, 3, "resume")
    _, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    assert b"resuming from step 3" in stderr

    expected = prompts_by_step(tmp_path / "straight")
    got = prompts_by_step(killed_dir)
    # steps trained after the checkpoint and before the kill are trained again on resume,
    # on exactly the same prompts; every step's prompts equal the uninterrupted run's
    for step, ids in expected.items():
        assert sorted(got[step]) == sorted(ids), step  # the abandoned rows of the killed attempt left out
    assert sorted(got) == sorted(expected)
    every = RunReader(killed_dir).rollouts(include_abandoned=True)
    retrained = {r["step"] for r in every if r["attempt"] == 0} & {r["step"] for r in every if r["attempt"] == 1}
    assert retrained == {s for s in steps_before_kill if s >= 3}  # still readable, as abandoned
