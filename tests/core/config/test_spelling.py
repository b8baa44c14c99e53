"""Messages for names and values that are almost right: look-alike letters, dotted paths, ``1e6``."""

from __future__ import annotations

from pathlib import Path

import pytest

from telescope.config.errors import ConfigError
from telescope.config.loader import load_config


def problems(tmp_path: Path, text: str, *overrides: str) -> list[str]:
    path = tmp_path / "run.yaml"
    path.write_text("model: tiny:test\nenvironments: [{name: countdown}]\n" + text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides), check_plugins=False)
    return info.value.problems


def test_a_look_alike_letter_is_named_with_its_code_point(tmp_path: Path) -> None:
    [problem] = problems(tmp_path, "l\u0435arning_rate: 1.0e-5\n")  # a Cyrillic e
    assert "did you mean 'learning_rate'" in problem
    assert "U+0435 CYRILLIC SMALL LETTER IE" in problem and "position 1" in problem


def test_a_dotted_override_says_how_to_give_a_nested_value(tmp_path: Path) -> None:
    [known, unknown] = problems(tmp_path, "", "--environments.0.name", "countdown", "--wandb.project", "x")
    assert "unknown key 'environments.0.name' (cli)" in known
    assert "a dotted name sets no nested value" in known and "--environments '[{...}]'" in known
    assert "--wandb '{project: ...}'" in unknown and "'wandb' is no field either" in unknown


def test_a_dotted_key_in_the_file_says_how_to_nest_it(tmp_path: Path) -> None:
    [problem] = problems(tmp_path, "ray_runtime_env.env_vars: {A: b}\n")
    assert "a dotted key sets no nested value: write ray_runtime_env: with the nested value under it" in problem


@pytest.mark.parametrize(("written", "spelled"), [("1e6", "1.0e+6"), ("2E3", "2.0e+3")])
def test_exponent_notation_yaml_reads_as_text_gets_the_spelling_it_needs(
    tmp_path: Path, written: str, spelled: str
) -> None:
    [problem] = problems(tmp_path, f"number_of_steps: {written}\n")
    assert problem.startswith("number_of_steps (") and f"YAML reads {written} as text, not a number" in problem
    assert spelled in problem and f"write number_of_steps: {int(float(written))}" in problem
    [problem] = problems(tmp_path, "", "--number_of_steps", written)
    assert f"write --number_of_steps {int(float(written))}" in problem and "(cli)" in problem


def test_a_look_alike_letter_in_an_environment_kwarg_is_named_too(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("model: tiny:test\nenvironments: [{name: countdown, kwargs: {s\u0435ed: 1}}]\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    [problem] = info.value.problems
    assert "did you mean 'seed'" in problem and "U+0435 CYRILLIC SMALL LETTER IE" in problem
