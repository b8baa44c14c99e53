"""How the ray_* options map onto Ray's runtime environment (no cluster needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from telescope.config.loader import load_config
from telescope.runtime.ray_services import runtime_env


def config(**values: object):  # type: ignore[no-untyped-def]
    return load_config(None, {"environments": [{"name": "countdown"}], **values}, check_plugins=False).config


def test_runtime_env_carries_the_venv_run_dir_and_user_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VIRTUAL_ENV", "/somewhere/.venv")
    env = runtime_env(config(ray_runtime_env={"env_vars": {"X": "1"}, "pip": ["six"]}), tmp_path)
    assert env["pip"] == ["six"]
    assert env["env_vars"]["X"] == "1"
    assert env["env_vars"]["VIRTUAL_ENV"] == "/somewhere/.venv"
    assert env["env_vars"]["TELESCOPE_RUN_DIR"] == str(tmp_path)
    assert env["py_executable"] == sys.executable


def test_runtime_env_options_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIRTUAL_ENV", "/somewhere/.venv")
    for name in ("RAY_AUTH_MODE", "WANDB_MODE", "HF_HUB_OFFLINE", "TELESCOPE_CACHE", "TOKENIZERS_PARALLELISM"):
        monkeypatch.delenv(name, raising=False)
    env = runtime_env(
        config(ray_propagate_active_venv=False, ray_propagate_run_dir=False, ray_pin_py_executable=False), tmp_path
    )
    assert env == {}
