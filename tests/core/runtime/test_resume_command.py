"""The command a run that lost its trainer prints: the same `telescope run`, resuming from the last checkpoint."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from telescope.runtime.launch import _resume_command


@pytest.mark.parametrize(
    ("argv", "checkpoint", "expected"),
    [
        (
            ["telescope", "run", "c.yaml", "--number_of_steps", "9"],
            Path("ck/step_00000004"),
            "telescope run c.yaml --number_of_steps 9 --run_dir runs/x --resume_from_checkpoint true",
        ),
        (
            ["telescope", "--debug", "run", "c.yaml", "--run_dir", "runs/y", "--resume_from_checkpoint", "2"],
            Path("ck/step_00000004"),
            "telescope run c.yaml --run_dir runs/y --resume_from_checkpoint true",
        ),
        (
            ["telescope", "run", "c.yaml", "--resume-from-checkpoint=3", "--evals", "[{name: a b}]"],
            None,
            "telescope run c.yaml --evals '[{name: a b}]' --run_dir runs/x",
        ),
    ],
)
def test_the_resume_command_repeats_the_run_and_resumes(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], checkpoint: Path | None, expected: str
) -> None:
    monkeypatch.setattr(sys, "argv", argv)
    assert _resume_command(Path("runs/x"), checkpoint) == expected
