"""Countdown: parsing, reward on real completions, generated problems, conformance."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from telescope.api.records import Sample
from telescope.testing.environment import EnvironmentConformance
from telescope_envs.countdown import (
    CountdownEnvironment,
    ExpressionError,
    generate_problems,
    parse_expression,
)

DATA = Path(__file__).parent / "data"


def data_file(name: str) -> str:
    return str(DATA / name)


def _sample(nums: list[int], target: int) -> Sample:
    return Sample(prompt="p", answer={"nums": nums, "target": target}, sample_id="s")


def _reward(text: str, nums: list[int], target: int) -> float:
    return CountdownEnvironment(dataset_name="generated").compute_reward(text, _sample(nums, target)).total_reward


class TestCountdownConformance(EnvironmentConformance):
    def environment_factory(self) -> CountdownEnvironment:
        return CountdownEnvironment(dataset_name=data_file("countdown.jsonl"))

    def right_completion(self, sample: Sample) -> str | None:
        good = {24: "6 * 4 * 1", 10: "2 * 3 + 4", 7: "7 * (1 * 1)", 12: "(3 + 5) * 1 + 4"}
        return f"<answer>{good[sample.answer['target']]}</answer>"


class TestGeneratedConformance(EnvironmentConformance):
    def environment_factory(self) -> CountdownEnvironment:
        return CountdownEnvironment(dataset_name="generated", num_samples=20, num_numbers=2, max_number=10, seed=3)


def test_right_answer_scores_two() -> None:
    assert _reward("Thinking... <answer>(2 * 3) + 4</answer>", [2, 3, 4], 10) == 2.0


def test_number_used_twice_is_wrong_but_well_formed() -> None:
    # 4 + 4 + 2 = 10 reaches the target but uses 4 twice and never uses 3.
    assert _reward("<answer>4 + 4 + 2</answer>", [2, 3, 4], 10) == 1.0


def test_missing_number_is_wrong() -> None:
    assert _reward("<answer>6 * 4</answer>", [4, 6, 1], 24) == 1.0
    assert _reward("<answer>6 * 4 * 1</answer>", [4, 6, 1], 24) == 2.0


def test_wrong_value_scores_format_only() -> None:
    assert _reward("<answer>2 + 3 + 4</answer>", [2, 3, 4], 10) == 1.0


def test_no_answer_tag_scores_zero() -> None:
    assert _reward("2 * 3 + 4 = 10", [2, 3, 4], 10) == 0.0


def test_last_answer_tag_counts() -> None:
    assert _reward("<answer>1</answer> no wait <answer>2*3+4</answer>", [2, 3, 4], 10) == 2.0


def test_equals_suffix_tolerated() -> None:
    assert _reward("<answer>2 * 3 + 4 = 10</answer>", [2, 3, 4], 10) == 2.0


def test_exact_division() -> None:
    assert _reward("<answer>(7 / 2) * 2</answer>", [7, 2, 2], 7) == 2.0
    assert _reward("<answer>7 / (2 - 2)</answer>", [7, 2, 2], 7) == 0.0  # division by zero: malformed


@pytest.mark.parametrize(
    "text",
    ["__import__('os').system('echo hi')", "2 ** 10", "-3 + 5", "2.5 * 4", "abs(3)", "3 // 2", "x + 1", "(" * 300],
)
def test_unsafe_or_invalid_expressions_rejected(text: str) -> None:
    with pytest.raises(ExpressionError):
        parse_expression(text)


def test_parse_expression_values() -> None:
    assert parse_expression("(1 + 2) * 3") == (Fraction(9), [1, 2, 3])
    assert parse_expression("10 / 4") == (Fraction(5, 2), [10, 4])


def test_generated_problems_are_deterministic_and_solvable() -> None:
    a = generate_problems(30, num_numbers=3, max_number=10, seed=7)
    assert a == generate_problems(30, num_numbers=3, max_number=10, seed=7)
    assert a != generate_problems(30, num_numbers=3, max_number=10, seed=8)
    for nums, target in a:
        assert len(nums) == 3 and all(1 <= n <= 10 for n in nums) and target > 0
    # a brute-force solver finds a solution for each of a few problems
    from itertools import permutations, product

    def solvable(nums: list[int], target: int) -> bool:
        for perm in permutations(nums):
            for ops in product("+-*/", repeat=len(nums) - 1):
                for shape in ("(({a}{o0}{b}){o1}{c})", "({a}{o0}({b}{o1}{c}))"):
                    expr = shape.format(a=perm[0], b=perm[1], c=perm[2], o0=ops[0], o1=ops[1])
                    try:
                        if parse_expression(expr)[0] == target:
                            return True
                    except ExpressionError:
                        continue
        return False

    assert all(solvable(nums, target) for nums, target in a[:10])


def test_generated_small_problems() -> None:
    samples = CountdownEnvironment(dataset_name="generated", num_samples=5, num_numbers=2, max_number=5).load_dataset()
    assert len(samples) == 5
    assert all(len(s.answer["nums"]) == 2 and max(s.answer["nums"]) <= 5 for s in samples)
    assert "<answer>" in str(samples[0].prompt)
