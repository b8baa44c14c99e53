"""The CPU hendrycks_math examples' data file: what its script writes, and what the environment reads from it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

from telescope_envs.hendrycks_math import HendrycksMathEnvironment

DATA = Path(__file__).resolve().parents[2] / "configs" / "examples" / "cpu" / "data"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_math_arithmetic", DATA / "make_math_arithmetic.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_file_is_what_its_script_writes() -> None:
    shipped = [json.loads(line) for line in (DATA / "math_arithmetic.jsonl").read_text().splitlines()]
    assert shipped == _script().arithmetic_rows()


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
