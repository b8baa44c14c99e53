"""The CPU hendrycks_math examples' data file: what its script writes, and what the environment reads from it."""

from __future__ import annotations

import json

from data_scripts import DATA, data_script

from telescope_envs.hendrycks_math import HendrycksMathEnvironment


def test_the_shipped_file_is_what_its_script_writes() -> None:
    shipped = [json.loads(line) for line in (DATA / "math_arithmetic.jsonl").read_text().splitlines()]
    assert shipped == data_script("make_math_arithmetic").arithmetic_rows()


def test_every_problem_is_distinct_and_its_answer_is_right() -> None:
    samples = HendrycksMathEnvironment(dataset_name=str(DATA / "math_arithmetic.jsonl")).load_dataset()
    assert len(samples) == len({s.prompt for s in samples}) == 1899
    operations = {"+": int.__add__, "*": int.__mul__}
    for sample in samples:
        question = sample.prompt.split("\n")[0]
        numbers = [int(part) for part in question.split("$")[1::2] if part.isdigit()]
        if "larger" in question:
            expected = max(numbers)
        elif "smaller" in question:
            expected = min(numbers)
        else:
            left, operator, right = question.split("$")[1].replace("\\cdot", "*").split()
            expected = operations[operator](int(left), int(right))
        assert str(sample.answer) == str(expected), question
