"""Checks of values against the outside world: model folders and environment constructors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from telescope.config.checks import environment_kwargs_problems, model_problems
from telescope_envs.countdown import CountdownEnvironment

# ------------------------------------------------------------------ model


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return cache


def test_tiny_presets_are_fine_and_unknown_ones_listed(hf_cache: Path) -> None:
    assert model_problems("tiny:test") == [] and model_problems("tiny:small") == []
    [problem] = model_problems("tiny:huge")
    assert "unknown tiny model preset 'huge'" in problem and "tiny:test" in problem


@pytest.mark.parametrize("spelling", ["absolute", "./relative", "~/home"])
def test_a_missing_local_path_is_an_error_naming_it(
    hf_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    model = {"absolute": str(tmp_path / "no-model"), "./relative": "./no-model", "~/home": "~/no-model"}[spelling]
    [problem] = model_problems(model)
    assert model in problem and "does not exist" in problem and str(tmp_path / "no-model") in problem


def test_a_local_folder_needs_a_config_json(hf_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "r1"
    (run / "step_10").mkdir(parents=True)
    (run / "step_10" / "config.json").write_text("{}")
    [problem] = model_problems("runs/r1")  # an existing relative path is local, though shaped like org/name
    assert "runs/r1" in problem and "holds no config.json" in problem and "step_10" in problem
    assert model_problems("runs/r1/step_10") == [] and model_problems(str(run / "step_10")) == []
    (tmp_path / "weights.bin").write_text("")
    assert "is a file" in model_problems(str(tmp_path / "weights.bin"))[0]


def test_hub_ids_are_accepted_unless_offline_and_not_cached(hf_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert model_problems("Qwen/Qwen2.5-3B", hub_cache=True) == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert model_problems("Qwen/Qwen2.5-3B") == []  # validating: another machine may have it
    [problem] = model_problems("Qwen/Qwen2.5-3B", hub_cache=True)  # running here: it must be cached
    assert "not in the local Hugging Face cache" in problem and "HF_HUB_OFFLINE" in problem
    assert str(hf_cache) in problem
    snapshot = hf_cache / "models--Qwen--Qwen2.5-3B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert model_problems("Qwen/Qwen2.5-3B", hub_cache=True) == []


def test_a_value_not_shaped_like_a_hub_id_is_a_path(hf_cache: Path, tmp_path: Path) -> None:
    [problem] = model_problems("org/name/extra")
    assert "does not exist" in problem


def test_model_checks_import_no_torch() -> None:
    probe = (
        "import sys; from telescope.config.checks import model_problems; model_problems('tiny:test'); "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


# ------------------------------------------------------------------ environment kwargs


def test_unknown_countdown_kwargs_with_suggestions() -> None:
    problems = environment_kwargs_problems("countdown", CountdownEnvironment, {"num_sample": 5, "seed": 1})
    [problem] = problems
    assert "environment 'countdown': unknown keyword argument 'num_sample'" in problem
    assert "did you mean 'num_samples'" in problem and "CountdownEnvironment takes: dataset_name" in problem
    assert environment_kwargs_problems("countdown", CountdownEnvironment, {"seed": 1, "prompt_style": "compact"}) == []


def test_a_key_yaml_read_as_a_boolean_is_named() -> None:
    [problem] = environment_kwargs_problems("countdown", CountdownEnvironment, {True: 1})
    assert "kwargs key True is read by YAML as a boolean" in problem


class Open:
    def __init__(self, size: int = 1, **options: Any) -> None:
        self.options = options


class Closed:
    def __init__(self, path: str, *, size: int = 1) -> None:
        self.path = path


class PositionalOnly:
    def __init__(self, data: str, /, size: int = 1) -> None:
        self.data = data


def test_a_catch_all_means_nothing_can_be_said() -> None:
    assert environment_kwargs_problems("open", Open, {"anything": 1, "sise": 2}) == []


def test_real_environments_name_their_keyword_arguments() -> None:
    [problem] = environment_kwargs_problems("countdown", CountdownEnvironment, {"num_sample": 5})
    assert "unknown keyword argument 'num_sample'" in problem and "did you mean 'num_samples'" in problem


def test_closed_signatures_missing_and_positional_only_parameters() -> None:
    problems = environment_kwargs_problems("closed", Closed, {"sise": 2})
    assert any("unknown keyword argument 'sise'" in p and "did you mean 'size'" in p for p in problems)
    assert any("kwargs needs 'path'" in p for p in problems)
    [problem] = environment_kwargs_problems("po", PositionalOnly, {"data": "x"})
    assert "unknown keyword argument 'data'" in problem  # positional-only: not a keyword


def test_an_unreadable_signature_gives_nothing() -> None:
    assert environment_kwargs_problems("int", int, {"bogus": 1}) == []
