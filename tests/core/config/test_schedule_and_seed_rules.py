"""A warmup longer than the run, and seeds no consumer accepts, are validate-time errors."""

from __future__ import annotations

from typing import Any

import pytest

from telescope.config.errors import ConfigError
from telescope.config.loader import load_config

RUN = {"environments": [{"name": "countdown"}], "model": "tiny:test"}


def problems(**values: Any) -> list[str]:
    try:
        load_config(None, {**RUN, **values}, check_plugins=False)
    except ConfigError as exc:
        return exc.problems
    return []


@pytest.mark.parametrize("scheduler", ["linear", "cosine"])
def test_a_decaying_schedule_needs_steps_after_its_warmup(scheduler: str) -> None:
    [problem] = problems(lr_scheduler=scheduler, warmup_steps=50, number_of_steps=20)
    assert "warmup_steps (50) must be smaller than number_of_steps (20)" in problem and scheduler in problem
    assert problems(lr_scheduler=scheduler, warmup_steps=20, number_of_steps=20) != []
    assert problems(lr_scheduler=scheduler, warmup_steps=19, number_of_steps=20) == []


def test_a_constant_schedule_must_finish_its_warmup_and_none_ignores_it() -> None:
    [problem] = problems(lr_scheduler="constant", warmup_steps=21, number_of_steps=20)
    assert "never reach learning_rate" in problem
    assert problems(lr_scheduler="constant", warmup_steps=20, number_of_steps=20) == []
    assert problems(lr_scheduler="none", warmup_steps=500, number_of_steps=20) == []


def test_a_seed_beyond_what_torch_and_numpy_take_is_refused() -> None:
    [problem] = problems(seed=2**64)
    assert problem.startswith("seed = 18446744073709551616") and "less than or equal to 4294967295" in problem
    [problem] = problems(seed=2**32 - 1, inference_num_workers=2)
    assert "seeded with seed + i" in problem and "at most 4294967294" in problem
    assert problems(seed=2**32 - 2, inference_num_workers=2) == []


def test_tensor_parallel_inference_needs_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    from telescope.config import rules

    def tp_problems(**values: Any) -> list[str]:
        try:
            load_config(None, {**RUN, "inference_num_workers": 2, "inference_tensor_parallel_size": 2, **values})
        except ConfigError as exc:
            return [p for p in exc.problems if "inference_tensor_parallel_size" in p]
        return []

    [problem] = tp_problems(inference_backend="embedded")
    assert "needs the vllm inference backend" in problem and "runs on one device" in problem
    monkeypatch.setattr(rules, "module_installed", lambda module: module != "vllm")
    [problem] = tp_problems(inference_backend="auto")
    assert "inference_backend: auto, without vLLM installed" in problem
    monkeypatch.setattr(rules, "module_installed", lambda module: True)
    assert tp_problems(inference_backend="auto") == []  # vLLM when the workers have GPUs
    assert tp_problems(inference_backend="embedded", inference_tensor_parallel_size=1) == []
