"""Local data files named by environment kwargs: missing, unparsable, or missing a field, each named by line."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from telescope.config.data_files import data_file_kwargs_problems, data_file_problems, looks_like_data_file

FIELDS = ("nums", "target")


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_row_without_a_field_is_named_by_file_line_and_field(tmp_path: Path) -> None:
    path = write(
        tmp_path / "d.jsonl", '{"nums": [1, 2], "target": 3}\n\n{"nums": [2, 2]}\n{"nums": [1], "target": null}\n'
    )
    assert data_file_problems(path, FIELDS) == [
        f"{path} line 3: the row has no 'target' field (every row needs: nums, target)",
        f"{path} line 4: field 'target' is null",
    ]


def test_a_truncated_json_lines_file_names_its_last_line(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", '{"nums": [1, 2], "target": 3}\n{"nums": [1, 2], "tar')
    [problem] = data_file_problems(path, FIELDS)
    assert problem.startswith(f"{path} line 2: not valid JSON (the file looks truncated): Unterminated string")


def test_a_file_that_does_not_exist(tmp_path: Path) -> None:
    path = str(tmp_path / "missing.jsonl")
    [problem] = data_file_problems(path, FIELDS)
    assert problem.startswith(f"{path} does not exist")


def test_a_json_array_names_the_line_of_the_bad_element(tmp_path: Path) -> None:
    path = write(tmp_path / "d.json", '[\n  {"nums": [1], "target": 1},\n  {"nums": [2]},\n  3\n]\n')
    assert data_file_problems(path, FIELDS) == [
        f"{path} line 3 (element 1): the row has no 'target' field (every row needs: nums, target)",
        f"{path} line 4 (element 2): a row must be a JSON object ({{...}}), not int",
    ]
    broken = write(tmp_path / "e.json", '[\n  {"nums": [1], "target": 1},\n  {"nums": [2]\n')
    [problem] = data_file_problems(broken, FIELDS)
    assert problem.startswith(f"{broken} line 4: not valid JSON")


def test_csv_header_and_empty_cells(tmp_path: Path) -> None:
    no_column = write(tmp_path / "a.csv", "nums,goal\n1 2,3\n")
    assert data_file_problems(no_column, FIELDS) == [
        f"{no_column} line 1 (the header): no 'target' column (columns: nums, goal)"
    ]
    empty = write(tmp_path / "b.csv", "nums,target\n1 2,3\n1 1,\n")
    assert data_file_problems(empty, FIELDS) == [f"{empty} line 3: field 'target' is empty"]


def test_many_problems_are_capped_per_file(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", '{"nums": [1]}\n' * 12)
    problems = data_file_problems(path, FIELDS)
    assert len(problems) == 6 and problems[-1] == f"{path}: 7 more problem(s) like these"


def test_hub_ids_and_keywords_are_not_files(tmp_path: Path) -> None:
    assert not looks_like_data_file("Jiayi-Pan/Countdown-Tasks-3to4")
    assert not looks_like_data_file("generated")
    assert looks_like_data_file("data/train.jsonl") and looks_like_data_file("./data")
    assert data_file_problems(str(tmp_path), FIELDS) == []  # a dataset folder is left to ``datasets``


class WithData:
    data_files: ClassVar[dict[str, tuple[str, ...]]] = {"dataset_name": FIELDS}

    def __init__(self, dataset_name: str = "org/hub-dataset", seed: int = 0) -> None:
        self.dataset_name = dataset_name


def test_kwargs_problems_name_the_environment_and_the_keyword(tmp_path: Path) -> None:
    good = write(tmp_path / "good.jsonl", '{"nums": [1, 2], "target": 3}\n')
    assert data_file_kwargs_problems("countdown", WithData, {"dataset_name": good}) == []
    assert data_file_kwargs_problems("countdown", WithData, {}) == []  # the default is a hub id
    missing = str(tmp_path / "nope.jsonl")
    [problem] = data_file_kwargs_problems("countdown", WithData, {"dataset_name": missing})
    assert problem.startswith(f"environment 'countdown': dataset_name: {missing} does not exist")
