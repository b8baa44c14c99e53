"""hendrycks_math, math500, aime and gpqa: boxed extraction, math-verify checks, conformance."""

from __future__ import annotations

from pathlib import Path

import pytest

from telescope.api.records import Sample
from telescope.testing.environment import EnvironmentConformance
from telescope_envs.gpqa import GPQAEnvironment, extract_choice
from telescope_envs.hendrycks_math import HendrycksMathEnvironment, MathEnvironment
from telescope_envs.math_answers import answers_match, extract_boxed

DATA = Path(__file__).parent / "data"


class TestHendrycksMathConformance(EnvironmentConformance):
    def environment_factory(self) -> HendrycksMathEnvironment:
        return HendrycksMathEnvironment(dataset_name=str(DATA / "math.jsonl"))

    def right_completion(self, sample: Sample) -> str | None:
        return f"Working... so the answer is $\\boxed{{{sample.answer}}}$."


class TestMath500Conformance(EnvironmentConformance):
    def environment_factory(self) -> MathEnvironment:
        return MathEnvironment(dataset_name=str(DATA / "math500.jsonl"), dataset_split="test")

    def right_completion(self, sample: Sample) -> str | None:
        return f"\\boxed{{{sample.answer}}}"


class TestGPQAConformance(EnvironmentConformance):
    def environment_factory(self) -> GPQAEnvironment:
        return GPQAEnvironment(dataset_name=str(DATA / "gpqa.jsonl"))

    def right_completion(self, sample: Sample) -> str | None:
        return f"The answer is \\boxed{{{sample.answer}}}"


def _score(env: MathEnvironment, completion: str, answer: str) -> float:
    return env.compute_reward(completion, Sample(prompt="p", answer=answer, sample_id="x")).total_reward


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so $\\boxed{42}$", "42"),
        ("\\boxed{\\frac{1}{2}} then \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\boxed{x^{2}+\\sqrt{y}}", "x^{2}+\\sqrt{y}"),
        ("\\boxed 7", "7"),
        ("\\fbox{3}", "3"),
        ("no box", None),
        ("\\boxed{unclosed", None),
    ],
)
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("\\dfrac{3}{4}", "\\frac{3}{4}"),
        ("0.75", "\\frac34"),
        ("2\\sqrt{3}", "\\sqrt{12}"),
        ("1+x^2", "x^2+1"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("12.", "12"),
    ],
)
def test_equal_up_to_latex_formatting(pred: str, gold: str) -> None:
    assert answers_match(pred, gold)


@pytest.mark.parametrize(
    ("pred", "gold"), [("\\frac{3}{5}", "\\frac{3}{4}"), ("13", "12"), ("x^2-1", "x^2+1"), ("", "1")]
)
def test_different_answers_do_not_match(pred: str, gold: str) -> None:
    assert not answers_match(pred, gold)


def test_math_reward_on_real_completions() -> None:
    env = HendrycksMathEnvironment(dataset_name=str(DATA / "math.jsonl"))
    right = "We add: 1/2 + 1/4 = 2/4 + 1/4 = 3/4. The answer is $\\boxed{\\dfrac{3}{4}}$."
    wrong = "We add: 1/2 + 1/4 = 2/6. The answer is $\\boxed{\\frac{1}{3}}$."
    unboxed = "The answer is 3/4."
    assert _score(env, right, "\\frac{3}{4}") == 1.0
    assert _score(env, wrong, "\\frac{3}{4}") == 0.0
    assert _score(env, unboxed, "\\frac{3}{4}") == 0.0
    result = env.compute_reward(right, Sample(prompt="p", answer="\\frac{3}{4}", sample_id="x"))
    assert result.sample_metrics["correct"] == 1.0 and result.sample_metrics["has_boxed"] == 1.0


def test_math_reward_in_a_worker_thread() -> None:
    import threading

    env = MathEnvironment(dataset_name=str(DATA / "math500.jsonl"))
    out: list[float] = []
    t = threading.Thread(target=lambda: out.append(_score(env, "\\boxed{0.5}", "\\frac{1}{2}")))
    t.start()
    t.join()
    assert out == [1.0]


def test_reference_answer_from_solution_and_rows_without_answer_skipped() -> None:
    samples = HendrycksMathEnvironment(dataset_name=str(DATA / "math.jsonl")).load_dataset()
    assert [s.answer for s in samples] == ["\\frac{3}{4}", "2", "2\\sqrt{3}"]
    assert all("\\boxed{}" in str(s.prompt) for s in samples)


def test_gpqa_letters_deterministic_and_scored() -> None:
    env = GPQAEnvironment(dataset_name=str(DATA / "gpqa.jsonl"))
    a, b = env.load_dataset(), GPQAEnvironment(dataset_name=str(DATA / "gpqa.jsonl")).load_dataset()
    assert [s.prompt for s in a] == [s.prompt for s in b]
    sample = a[0]
    letter = str(sample.answer)
    assert f"{letter}) Electron" in str(sample.prompt)
    wrong = next(x for x in "ABCD" if x != letter)
    assert env.compute_reward(f"\\boxed{{{letter}}}", sample).total_reward == 1.0
    assert env.compute_reward(f"\\boxed{{{wrong}}}", sample).total_reward == 0.0
    assert env.compute_reward(f"Reasoning.\nAnswer: {letter}", sample).total_reward == 1.0
    assert extract_choice("\\boxed{(b)}") == "B"


def test_the_metrics_say_when_math_verify_decided() -> None:
    env = HendrycksMathEnvironment(dataset_name=str(DATA / "math.jsonl"))
    sample = Sample(prompt="p", answer="\\frac{1}{2}", sample_id="x")
    string = env.compute_reward("\\boxed{\\dfrac{1}{2}}", sample).sample_metrics  # normalised text decides
    symbolic = env.compute_reward("\\boxed{0.5}", sample).sample_metrics  # math-verify decides
    unboxed = env.compute_reward("one half", sample).sample_metrics
    assert (string["correct"], string["math_verify_checked"]) == (1.0, 0.0)
    assert (symbolic["correct"], symbolic["math_verify_checked"]) == (1.0, 1.0)
    assert (unboxed["has_boxed"], unboxed["math_verify_checked"]) == (0.0, 0.0)


def test_the_demonstration_is_the_reference_in_the_boxed_format() -> None:
    env = HendrycksMathEnvironment(dataset_name=str(DATA / "math.jsonl"))
    sample = env.load_dataset()[0]
    demonstration = env.demonstration(sample)
    assert demonstration is not None and extract_boxed(demonstration) == sample.answer
    assert env.compute_reward(demonstration, sample).total_reward == 1.0
