"""A run's start-up: the tokenizer (with transformers and torch) loads beside ``ray.init``, not after it."""

from __future__ import annotations

from pathlib import Path

import pytest

from telescope.runtime import launch, ray_cluster


def test_the_tokenizer_starts_loading_before_ray_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Loaded after ``ray.init``, its imports (3-4 s of CPU) delayed every worker's placement."""
    from telescope.config import load_config

    calls: list[str] = []
    started: list[launch._EarlyTokenizer] = []
    load_early = launch._load_tokenizer_early

    def tokenizer(model: str) -> launch._EarlyTokenizer:
        calls.append("tokenizer")
        started.append(load_early(model))
        return started[-1]

    def connect(config: object, run_dir: Path) -> bool:
        calls.append("ray")
        raise ray_cluster.RayStartError("stopped here by the test")

    monkeypatch.setattr(launch, "_load_tokenizer_early", tokenizer)
    monkeypatch.setattr(ray_cluster, "connect_ray", connect)
    args = ["--model", "tiny:test", "--environments", "[{name: countdown}]", "--use_wandb", "false"]
    code = launch.launch_run(load_config(None, [*args, "--run_dir", str(tmp_path / "run")]))
    assert code == 2  # the RayStartError, a user error at start
    assert calls == ["tokenizer", "ray"]
    # the run ended before it needed the tokenizer, but not while its thread was importing transformers
    assert started[0].imported.is_set()


def test_the_early_tokenizer_is_the_models_and_a_failure_reaches_the_awaiting_code(tmp_path: Path) -> None:
    from telescope.models.tiny import PRESETS, build_tiny_model

    path = build_tiny_model(tmp_path / "tiny", PRESETS["test"])
    tokenizer = launch._load_tokenizer_early(str(path)).tokenizer.result(timeout=120)
    assert tokenizer.decode(tokenizer.encode("1 + 2 = 3")) == "1 + 2 = 3"
    with pytest.raises(OSError):
        launch._load_tokenizer_early(str(tmp_path / "no-such-model")).tokenizer.result(timeout=120)


@pytest.mark.slow
def test_ctrl_c_leaves_its_reason_in_the_status(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """SIGINT (a real one, to this process) stops the run with ``interrupted`` and says why in status.json."""
    import json
    import os
    import signal
    import time

    from telescope.config import load_config

    def connect(config: object, run_dir: Path) -> bool:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while Ray starts
        time.sleep(5)  # the KeyboardInterrupt is raised here
        raise AssertionError("SIGINT did not interrupt the run")

    monkeypatch.setattr(ray_cluster, "connect_ray", connect)
    # A test runner started in the background (``cmd &``) inherits SIGINT ignored, and Python then
    # installs no handler: give this process the handler an interactive ``telescope run`` has.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    args = ["--model", "tiny:test", "--environments", "[{name: countdown}]", "--use_wandb", "false"]
    run_dir = tmp_path / "run"
    try:
        code = launch.launch_run(load_config(None, [*args, "--run_dir", str(run_dir)]))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "interrupted" and status["error"] == "interrupted by SIGINT (Ctrl-C)"


def test_sigterm_while_ray_starts_is_an_interruption(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``ray.init`` installs its own SIGTERM handler (``sys.exit(15)``): the run was stopped, not completed.

    The exit was once reported as ``completed`` with code 15, after waiting two minutes for the
    tokenizer thread, which an exception raised mid-import in the main thread can leave blocked
    on the import lock for good: an interrupted run waits for it only its cleanup's budget.
    """
    import json
    import signal

    from telescope.config import load_config

    def connect(config: object, run_dir: Path) -> bool:
        raise SystemExit(signal.SIGTERM)  # what Ray's handler does

    waits: list[float] = []
    wait = launch._EarlyTokenizer.wait_until_imported

    def recorded_wait(self: launch._EarlyTokenizer, timeout_s: float = 120.0) -> None:
        waits.append(timeout_s)
        wait(self, timeout_s)

    monkeypatch.setattr(ray_cluster, "connect_ray", connect)
    monkeypatch.setattr(launch._EarlyTokenizer, "wait_until_imported", recorded_wait)
    args = ["--model", "tiny:test", "--environments", "[{name: countdown}]", "--use_wandb", "false"]
    run_dir = tmp_path / "run"
    code = launch.launch_run(load_config(None, [*args, "--run_dir", str(run_dir)]))
    assert code == 130
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "interrupted" and status["error"] == "terminated by SIGTERM"
    assert waits == [launch.TERMINATION_CLEANUP_S]


def test_another_exit_during_the_start_is_a_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import json

    from telescope.config import load_config

    def connect(config: object, run_dir: Path) -> bool:
        raise SystemExit(3)

    monkeypatch.setattr(ray_cluster, "connect_ray", connect)
    args = ["--model", "tiny:test", "--environments", "[{name: countdown}]", "--use_wandb", "false"]
    run_dir = tmp_path / "run"
    assert launch.launch_run(load_config(None, [*args, "--run_dir", str(run_dir)])) == 3
    assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"
