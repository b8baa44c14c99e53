"""How the ray_* options map onto Ray's runtime environment (no cluster needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from telescope.config.loader import load_config
from telescope.runtime.ray_cluster import exported, inheritable_variables, runtime_env


def config(**values: object):  # type: ignore[no-untyped-def]
    return load_config(None, {"environments": [{"name": "countdown"}], **values}, check_plugins=False).config


def test_runtime_env_carries_the_venv_and_user_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIRTUAL_ENV", "/somewhere/.venv")
    env = runtime_env(config(ray_runtime_env={"env_vars": {"X": "1"}, "pip": ["six"]}), tmp_path)
    assert env["pip"] == ["six"]
    assert env["env_vars"]["X"] == "1"
    assert env["env_vars"]["VIRTUAL_ENV"] == "/somewhere/.venv"
    assert "TELESCOPE_RUN_DIR" not in env["env_vars"]  # workers are given the run directory, not a variable
    assert env["py_executable"] == sys.executable


def test_runtime_env_options_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VIRTUAL_ENV", "/somewhere/.venv")
    for name in ("RAY_AUTH_MODE", "WANDB_MODE", "HF_HUB_OFFLINE", "TELESCOPE_CACHE", "TOKENIZERS_PARALLELISM"):
        monkeypatch.delenv(name, raising=False)
    env = runtime_env(
        config(
            ray_propagate_active_venv=False,
            ray_pin_py_executable=False,
            ray_worker_keep_freed_memory=False,
        ),
        tmp_path,
    )
    assert env == {}


def test_workers_keep_freed_memory_unless_the_user_chose_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "4096")  # the environment's value wins over the default
    env_vars = runtime_env(config(), tmp_path)["env_vars"]
    assert env_vars["MALLOC_MMAP_THRESHOLD_"] == str(1 << 30)
    assert env_vars["MALLOC_TRIM_THRESHOLD_"] == "4096"
    chosen = runtime_env(config(ray_runtime_env={"env_vars": {"MALLOC_MMAP_THRESHOLD_": "65536"}}), tmp_path)
    assert chosen["env_vars"]["MALLOC_MMAP_THRESHOLD_"] == "65536"  # ray_runtime_env's value wins
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    off = runtime_env(config(ray_worker_keep_freed_memory=False), tmp_path).get("env_vars", {})
    assert not any(name.startswith("MALLOC_") for name in off)


def test_auto_attaches_only_to_ray_address_or_a_ray_start_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not to a cluster found by its processes alone (one another run started for itself with ray.init)."""
    import socket

    import ray._private.services as services

    from telescope.runtime import ray_cluster

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: {"192.0.2.7:6379"})  # never consulted
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: None)
    assert ray_cluster.registered_cluster() is None
    with socket.socket() as listening:  # a `ray start` cluster registered in /tmp/ray/ray_current_cluster
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: address)
        assert ray_cluster.registered_cluster() == address
    assert ray_cluster.registered_cluster() is None  # registered, but it no longer answers
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert ray_cluster.registered_cluster() == "10.0.0.1:6379"


def test_custom_resources_per_worker_are_validated() -> None:
    assert config(ray_inference_resources_per_worker={"node_b": 1}).ray_inference_resources_per_worker == {
        "node_b": 1.0
    }
    for bad in ({"GPU": 1}, {"node_b": 0}):
        with pytest.raises(Exception, match="ray_trainer_resources_per_worker"):
            config(ray_trainer_resources_per_worker=bad)


def test_only_variables_and_this_interpreter_are_inherited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = runtime_env(config(), tmp_path)
    assert inheritable_variables(env) == env["env_vars"]
    assert inheritable_variables({**env, "py_executable": "/other/python"}) is None  # another interpreter
    assert inheritable_variables({**env, "working_dir": str(tmp_path)}) is None  # Ray must set that up
    assert inheritable_variables(runtime_env(config(ray_runtime_env={"pip": ["six"]}), tmp_path)) is None
    assert inheritable_variables({}) == {}


def test_exported_variables_are_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setenv("TELESCOPE_TEST_KEPT", "before")
    monkeypatch.delenv("TELESCOPE_TEST_NEW", raising=False)
    with exported({"TELESCOPE_TEST_KEPT": "during", "TELESCOPE_TEST_NEW": "x"}):
        assert os.environ["TELESCOPE_TEST_KEPT"] == "during" and os.environ["TELESCOPE_TEST_NEW"] == "x"
    assert os.environ["TELESCOPE_TEST_KEPT"] == "before" and "TELESCOPE_TEST_NEW" not in os.environ
