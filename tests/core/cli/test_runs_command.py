"""``telescope runs``: run folders written by the real run store, listed as a table or JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from telescope.cli.main import main
from telescope.recording.run_store import RunStore

#: A driver that records ``running`` at step 1 through the real run store, then exits without an end.
DIES = (
    "import sys; from telescope.recording.run_store import RunStore; "
    "RunStore(sys.argv[1]).set_status('running', step=1)"
)


def completed_run(folder: Path, rewards: list[float], *, total: int) -> None:
    store = RunStore(folder)
    store.write_config("number_of_steps: 3\n", {"number_of_steps": total})
    store.set_status("running", step=0)
    store.begin_attempt(0, "start")
    for step, reward in enumerate(rewards):
        store.log_metrics(step, {"reward/mean": reward, "loss/policy": -reward})
        store.set_status("running", step=step + 1)
    store.set_status("completed")
    store.close()


def resumed_run(folder: Path) -> None:
    """Trained steps 0-2, was interrupted, resumed from its step-1 checkpoint and trained step 1 again."""
    store = RunStore(folder)
    store.write_config("", {"number_of_steps": 5})
    store.set_status("running", step=0)
    store.begin_attempt(0, "start")
    for step, reward in enumerate([0.1, 0.2, 0.9]):
        store.log_metrics(step, {"reward/mean": reward})
        store.set_status("running", step=step + 1)
    store.set_status("interrupted")
    store.close()
    store = RunStore(folder)
    store.set_status("running", step=1)
    store.begin_attempt(1, "resume")
    store.log_metrics(1, {"reward/mean": 0.3})
    store.set_status("interrupted", step=2)
    store.close()


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    completed_run(root / "alpha", [0.25, 0.5, 0.75], total=3)
    resumed_run(root / "beta")
    subprocess.run([sys.executable, "-c", DIES, str(root / "gamma")], check=True, timeout=120)
    (root / "not-a-run").mkdir()
    return root


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_json_lists_status_step_times_and_the_metrics_last_current_value(
    capsys: pytest.CaptureFixture[str], runs_dir: Path
) -> None:
    code, out, err = run_cli(capsys, "runs", str(runs_dir), "--json")
    assert code == 0, err
    runs = {run["name"]: run for run in json.loads(out)}
    assert set(runs) == {"alpha", "beta", "gamma"}
    alpha, beta, gamma = runs["alpha"], runs["beta"], runs["gamma"]
    assert (alpha["status"], alpha["step"], alpha["total_steps"], alpha["value"]) == ("completed", 3, 3, 0.75)
    assert alpha["metric"] == "reward/mean" and alpha["end_time"] >= alpha["start_time"]
    assert alpha["duration_s"] == pytest.approx(alpha["end_time"] - alpha["start_time"])
    # the resume went back on step 2 (reward 0.9): the current attempt's last row is step 1's 0.3
    assert (beta["status"], beta["step"], beta["total_steps"], beta["value"]) == ("interrupted", 2, 5, 0.3)
    # its process exited without recording an end: died, not running; no metrics yet
    assert (gamma["status"], gamma["step"], gamma["value"], gamma["end_time"]) == ("died", 1, None, None)
    assert "gone" in gamma["status_detail"]


def test_table_has_one_line_per_run_with_the_chosen_metric(capsys: pytest.CaptureFixture[str], runs_dir: Path) -> None:
    code, out, _ = run_cli(capsys, "runs", str(runs_dir / "alpha"), str(runs_dir / "beta"), "--metric", "loss/policy")
    assert code == 0
    header, *lines = out.splitlines()
    assert header.split() == ["NAME", "STATUS", "STEP", "START", "END", "DURATION", "loss/policy"]
    rows = {line.split()[0]: line.split() for line in lines}
    assert set(rows) == {"alpha", "beta"}
    assert rows["alpha"][1:3] == ["completed", "3/3"] and rows["alpha"][-1] == "-0.75"
    assert rows["beta"][1:3] == ["interrupted", "2/5"] and rows["beta"][-1] == "-"  # beta never logged it


def test_runs_defaults_to_the_runs_folder(
    capsys: pytest.CaptureFixture[str], runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(runs_dir.parent)
    code, out, _ = run_cli(capsys, "runs")
    assert code == 0 and [line.split()[0] for line in out.splitlines()[1:]] == ["alpha", "beta", "gamma"]


def test_a_metric_no_run_recorded_is_an_error_with_the_close_names(
    capsys: pytest.CaptureFixture[str], runs_dir: Path
) -> None:
    code, out, err = run_cli(capsys, "runs", str(runs_dir), "--metric", "reward/maen")
    assert code == 2 and out == ""
    assert err.startswith("error: no run recorded the metric 'reward/maen'") and "reward/mean" in err


def test_a_missing_folder_and_a_folder_without_runs_say_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run_cli(capsys, "runs", str(tmp_path / "nowhere"))
    assert (
        code == 2
        and out == ""
        and err
        == f"error: {tmp_path / 'nowhere'} does not exist; "
        + ("give a run directory or a folder of runs (default: runs/)\n")
    )
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    code, out, err = run_cli(capsys, "runs", str(tmp_path / "empty"))
    assert code == 1 and out == "" and err.startswith(f"no runs under {tmp_path / 'empty'}")
    assert "Traceback" not in err


def test_runs_imports_no_heavy_stack(runs_dir: Path) -> None:
    probe = (
        "import sys; from telescope.cli.main import main; code = main(sys.argv[1:]); "
        "heavy = sorted(m for m in ('torch', 'ray', 'transformers', 'vllm', 'datasets') if m in sys.modules); "
        "print('HEAVY=' + ','.join(heavy), file=sys.stderr); sys.exit(code)"
    )
    command = [sys.executable, "-c", probe, "runs", str(runs_dir)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.rstrip().endswith("HEAVY=")
