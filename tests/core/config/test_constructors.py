"""Environment kwargs against their constructor's annotations, and the signature read once per class."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from telescope.config import constructors
from telescope.config.constructors import constructor_of, kwargs_type_problems
from telescope.config.errors import ConfigError
from telescope.config.loader import load_config
from telescope_envs.countdown import CountdownEnvironment


class Annotated:
    """Annotations as strings (this module has ``from __future__ import annotations``)."""

    def __init__(
        self, count: int = 1, ratio: float = 0.5, path: Path | None = None, pair: tuple[int, int] = (1, 2), **rest: Any
    ) -> None:
        pass


def test_a_quoted_number_for_an_int_is_a_problem_naming_environment_argument_and_type() -> None:
    [(key, problem)] = kwargs_type_problems("countdown", CountdownEnvironment, {"num_numbers": "3"})
    assert key == "num_numbers"
    assert "environment 'countdown'" in problem and "num_numbers = '3'" in problem
    assert "num_numbers: int" in problem and "write it without quotes: num_numbers: 3" in problem


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"count": True}, "count"),
        ({"count": 1.5}, "count"),
        ({"ratio": "0.5"}, "ratio"),
        ({"pair": [1, "x"]}, "pair"),
        ({"path": 3}, "path"),
    ],
)
def test_values_of_the_wrong_type_are_found_through_string_annotations(kwargs: dict[str, Any], bad: str) -> None:
    [(key, problem)] = kwargs_type_problems("demo", Annotated, kwargs)
    assert key == bad and f"{bad} = " in problem and "Annotated's" in problem


def test_what_yaml_gives_and_constructors_take_is_accepted() -> None:
    fine = {"count": 3, "ratio": 1, "path": "data/x.json", "pair": [3, 4], "anything": object()}
    assert kwargs_type_problems("demo", Annotated, fine) == []


def test_the_loader_reports_a_mistyped_kwarg_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text('model: tiny:test\nenvironments:\n  - name: countdown\n    kwargs:\n      num_numbers: "3"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    [problem] = info.value.problems
    assert problem.startswith("environments[0].kwargs.num_numbers: environment 'countdown': num_numbers = '3'")
    assert "run.yaml:5)" in problem


def test_the_signature_is_read_once_per_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    real = inspect.signature

    def counting(obj: Any, *args: Any, **kwargs: Any) -> inspect.Signature:
        calls.append(obj)
        return real(obj, *args, **kwargs)

    constructor_of.cache_clear()
    monkeypatch.setattr(constructors.inspect, "signature", counting)
    entries = "".join(f"  - name: countdown\n    kwargs: {{seed: {i}}}\n" for i in range(300))
    path = tmp_path / "run.yaml"
    path.write_text(f"model: tiny:test\nenvironments:\n{entries}")
    load_config(path)
    assert calls.count(CountdownEnvironment) == 1
