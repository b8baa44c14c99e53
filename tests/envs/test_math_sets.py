"""dapo_math and deepscaler: loading their datasets' shapes, the verified-answer reward, conformance.

The data files under ``data/`` are small hand-written rows in each hub dataset's
format (``dapo_math.jsonl``: DAPO-Math-17k's chat ``prompt`` with its ``Answer:``
wrapper and ``reward_model``; ``deepscaler.jsonl``: ``problem``/``answer``/``solution``).
The hub names are checked by intercepting ``datasets.load_dataset``: no test opens
the network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from telescope.api.records import Sample
from telescope.testing.environment import EnvironmentConformance
from telescope_envs.math_sets import (
    DAPO_MATH_DATASET,
    DEEPSCALER_DATASET,
    DapoMathEnvironment,
    DeepScalerEnvironment,
    extract_answer_line,
    strip_dapo_instructions,
)

DATA = Path(__file__).parent / "data"


class TestDapoMathConformance(EnvironmentConformance):
    def environment_factory(self) -> DapoMathEnvironment:
        return DapoMathEnvironment(dataset_name=str(DATA / "dapo_math.jsonl"))

    def right_completion(self, sample: Sample) -> str | None:
        return f"Multiplying out... the answer is $\\boxed{{{sample.answer}}}$."


class TestDeepScalerConformance(EnvironmentConformance):
    def environment_factory(self) -> DeepScalerEnvironment:
        return DeepScalerEnvironment(dataset_name=str(DATA / "deepscaler.jsonl"))

    def right_completion(self, sample: Sample) -> str | None:
        return f"So we get \\boxed{{{sample.answer}}}"


def test_dapo_rows_lose_the_answer_line_wrapper_and_duplicates() -> None:
    samples = DapoMathEnvironment(dataset_name=str(DATA / "dapo_math.jsonl")).load_dataset()
    # 6 rows: one repeats an earlier problem, one has no reward_model
    assert [s.answer for s in samples] == ["54", "9", "2", "21"]
    first = str(samples[0].prompt)
    assert first.startswith("A rectangle has sides 6 and 9. What is its area?")
    assert "Answer:" not in first and "\\boxed{}" in first
    assert str(samples[2].prompt).startswith("What is the remainder")  # an unwrapped row stays as it is
    assert len({s.sample_id for s in samples}) == 4 and all(s.environment == "dapo_math" for s in samples)
    kept = DapoMathEnvironment(
        dataset_name=str(DATA / "dapo_math.jsonl"), deduplicate=False, strip_dataset_instructions=False
    ).load_dataset()
    assert [s.answer for s in kept] == ["54", "9", "54", "2", "21"]
    assert "Answer: $Answer" in str(kept[0].prompt)
    assert kept[0].sample_id != kept[2].sample_id  # identical rows get distinct, stable ids
    assert len(DapoMathEnvironment(dataset_name=str(DATA / "dapo_math.jsonl"), max_samples=2).load_dataset()) == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Some work.\nAnswer: 54", "54"),
        ("Answer: 3\nwait, recheck\nAnswer: $21$", "21"),
        ("**Answer:** 9.", "9"),
        ("answer: \\boxed{7}", "7"),
        ("The answer is 5", None),
    ],
)
def test_answer_line(text: str, expected: str | None) -> None:
    assert extract_answer_line(text) == expected


def test_strip_dapo_instructions_keeps_the_problem() -> None:
    wrapped = (
        "Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nFind $x$.\n\n"
        'Remember to put your answer on its own line after "Answer:".'
    )
    assert strip_dapo_instructions(wrapped) == "Find $x$."
    assert strip_dapo_instructions("Find $y$.") == "Find $y$."


def score(env: Any, completion: str, answer: str) -> dict[str, float]:
    result = env.compute_reward(completion, Sample(prompt="p", answer=answer, sample_id="x"))
    return {"reward": result.total_reward, **result.sample_metrics}


def test_dapo_reward_boxed_first_then_the_answer_line() -> None:
    env = DapoMathEnvironment(dataset_name=str(DATA / "dapo_math.jsonl"))
    boxed = score(env, "6 * 9 = 54, so $\\boxed{54}$.\nAnswer: 12", "54")
    assert boxed["reward"] == 1.0 and boxed["has_boxed"] == 1.0 and boxed["answer_line"] == 0.0
    line = score(env, "6 * 9 = 54.\nAnswer: 54", "54")
    assert line["reward"] == 1.0 and line["has_boxed"] == 0.0 and line["answer_line"] == 1.0
    assert score(env, "6 * 9 = 56.\nAnswer: 56", "54")["reward"] == 0.0
    assert score(env, "I think it is 54", "54")["reward"] == 0.0  # no final answer given
    assert score(env, "\\boxed{54.0}", "54")["reward"] == 1.0  # math-verify: numerically equal


def test_deepscaler_answer_column_with_the_solution_as_fallback() -> None:
    env = DeepScalerEnvironment(dataset_name=str(DATA / "deepscaler.jsonl"))
    samples = env.load_dataset()
    assert [s.answer for s in samples] == ["\\frac{1}{2}", "720", "3", "5\\sqrt{2}"]
    assert score(env, "\\boxed{0.5}", "\\frac{1}{2}")["reward"] == 1.0
    assert score(env, "\\boxed{\\sqrt{50}}", "5\\sqrt{2}")["reward"] == 1.0
    assert score(env, "\\boxed{700}", "720")["reward"] == 0.0


@pytest.mark.parametrize(
    ("env_class", "hub_name", "row"),
    [
        (
            DapoMathEnvironment,
            DAPO_MATH_DATASET,
            {"prompt": [{"role": "user", "content": "What is 2+2?"}], "reward_model": {"ground_truth": "4"}},
        ),
        (DeepScalerEnvironment, DEEPSCALER_DATASET, {"problem": "What is 2+2?", "answer": "4", "solution": ""}),
    ],
)
def test_the_hub_dataset_is_the_upstream_one(
    monkeypatch: pytest.MonkeyPatch, env_class: Any, hub_name: str, row: dict[str, Any]
) -> None:
    import datasets

    calls: list[tuple[Any, ...]] = []

    def fake_load_dataset(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        calls.append((*args, kwargs.get("split")))
        return [row]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    samples = env_class().load_dataset()
    assert calls == [(hub_name, "train")]
    assert [s.answer for s in samples] == ["4"]
    env_class(dataset_subset="default").load_dataset()
    assert calls[-1] == (hub_name, "default", "train")
