"""Bad countdown data files: caught by `telescope config validate` / `telescope run` before anything starts.

Each names the file, the line and the field; `telescope run` exits 2 with the message and no
traceback (before Ray). Loading the environment directly fails with the same message.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from telescope.cli.main import main
from telescope.config.errors import ConfigError
from telescope.config.loader import load_config
from telescope_envs.countdown import CountdownEnvironment

GOOD_ROW = '{"nums": [4, 6, 1], "target": 24}\n'


def bad_files(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """{case: (data file, what the message must say)} for the three bad files, written for real."""
    missing_field = tmp_path / "missing_field.jsonl"
    missing_field.write_text(GOOD_ROW + '{"nums": [2, 3, 4]}\n' + GOOD_ROW, encoding="utf-8")
    truncated = tmp_path / "truncated.jsonl"
    truncated.write_text(GOOD_ROW * 3 + '{"nums": [2, 3', encoding="utf-8")
    absent = tmp_path / "absent.jsonl"
    return {
        "missing_field": (str(missing_field), f"{missing_field} line 2: the row has no 'target' field"),
        "truncated": (str(truncated), f"{truncated} line 4: not valid JSON (the file looks truncated)"),
        "absent": (str(absent), f"{absent} does not exist"),
    }


def config_file(tmp_path: Path, data: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(f"environments:\n  - name: countdown\n    kwargs: {{dataset_name: '{data}'}}\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("case", ["missing_field", "truncated", "absent"])
def test_the_config_loader_reports_the_file_line_and_field(tmp_path: Path, case: str) -> None:
    data, expected = bad_files(tmp_path)[case]
    with pytest.raises(ConfigError) as raised:
        load_config(config_file(tmp_path, data))
    [problem] = [p for p in raised.value.problems if "dataset_name" in p]
    assert problem.startswith("environments[0].kwargs: environment 'countdown': dataset_name: ")
    assert expected in problem


@pytest.mark.parametrize("case", ["missing_field", "truncated", "absent"])
def test_telescope_run_exits_2_with_the_message_before_starting(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data, expected = bad_files(tmp_path)[case]
    path = config_file(tmp_path, data)
    for command in (["config", "validate"], ["run"]):
        code = main([*command, str(path), "--run_dir", str(tmp_path / "run")])
        _, err = capsys.readouterr()
        assert code == 2, err
        assert expected in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing started


def test_loading_a_bad_file_directly_names_the_line_and_field(tmp_path: Path) -> None:
    for data, expected in bad_files(tmp_path).values():
        with pytest.raises(ValueError) as raised:
            CountdownEnvironment(dataset_name=data).load_dataset()
        assert expected in str(raised.value)
