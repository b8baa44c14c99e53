"""Competition math with a boxed final answer, checked by math-verify.

:class:`MathEnvironment` is the generic single-turn "answer in ``\\boxed{}``"
environment; the ``hendrycks_math`` environment and the ``math500`` and
``aime_*`` evals are instances of it with different datasets.

- Prompt: the problem, then "put your final answer within ``\\boxed{}``".
- Reward (0 or 1): the last ``\\boxed{...}`` of the completion equals the reference
  answer up to LaTeX formatting and mathematical equivalence
  (:func:`telescope_envs.math_answers.check_answer`, math-verify).
- Reference: the ``answer_column`` when the dataset has one (MATH-500, AIME),
  otherwise the last ``\\boxed{}`` of the ``solution_column`` (the MATH train set).
- Sample metrics: ``correct``, ``has_boxed``, ``math_verify_checked`` (1 when the
  boxed answer was not a plain string match, so math-verify decided), ``response_chars``,
  ``reward_compute_time``.
- ``add_thinking_prefix``: the prompt ends with an open ``<think>`` assistant turn
  (:mod:`telescope_envs._prompts`).
- Demonstration (for the optional warm start): ``The answer is $\\boxed{<reference>}$.``

Needs ``math-verify`` (``pip install 'telescope-envs[math]'``): declared in ``requires``,
so ``telescope config validate`` reports it missing; it is imported when the first
completion that is not a string match is scored, not when the module is imported.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from telescope.api.environment import BaseEnvironment
from telescope.api.records import RewardResult, Sample
from telescope_envs._data import load_rows, stable_id, unique_ids
from telescope_envs._prompts import ThinkingPrefix
from telescope_envs.math_answers import check_answer, extract_boxed

HENDRYCKS_MATH_DATASET = "DigitalLearningGmbH/MATH-lighteval"
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


class MathEnvironment(ThinkingPrefix, BaseEnvironment):
    """Math problems whose reward is a math-verify check of the boxed answer."""

    name: ClassVar[str] = "math"
    data_files: ClassVar[dict[str, tuple[str, ...]]] = {"dataset_name": ()}  # column names vary by source
    metrics_ranges: ClassVar[dict[str, dict[str, float]]] = {
        "correct": {"min": 0.0, "max": 1.0},
        "has_boxed": {"min": 0.0, "max": 1.0},
        "math_verify_checked": {"min": 0.0, "max": 1.0},
    }
    reward_min: ClassVar[float] = 0.0
    reward_max: ClassVar[float] = 1.0
    requires: ClassVar[dict[str, str]] = {"math_verify": "pip install 'telescope-envs[math]'"}
    default_dataset: ClassVar[str] = "HuggingFaceH4/MATH-500"
    default_split: ClassVar[str] = "test"

    def __init__(
        self,
        dataset_name: str | None = None,
        dataset_split: str | None = None,
        dataset_subset: str | None = None,
        problem_column: str = "problem",
        answer_column: str | None = "answer",
        solution_column: str = "solution",
        max_samples: int | None = None,
        add_thinking_prefix: bool = False,
    ) -> None:
        self.add_thinking_prefix = add_thinking_prefix
        self.dataset_name = dataset_name or self.default_dataset
        self.dataset_split = dataset_split or self.default_split
        self.dataset_subset = dataset_subset
        self.problem_column = problem_column
        self.answer_column = answer_column
        self.solution_column = solution_column
        self.max_samples = max_samples

    def reference_answer(self, row: dict[str, Any]) -> str | None:
        if self.answer_column and row.get(self.answer_column) not in (None, ""):
            return str(row[self.answer_column]).strip()
        solution = row.get(self.solution_column)
        return extract_boxed(str(solution)) if solution else None

    def load_dataset(self) -> list[Sample]:
        rows = load_rows(self.dataset_name, self.dataset_split, self.dataset_subset)
        items: list[tuple[str, str]] = []
        for row in rows:
            answer = self.reference_answer(row)
            if answer:  # a problem without a checkable answer cannot be scored
                items.append((str(row[self.problem_column]), answer))
        if self.max_samples is not None:
            items = items[: self.max_samples]
        ids = unique_ids([stable_id(self.name, problem) for problem, _ in items])
        return [
            Sample(prompt=f"{problem}\n\n{INSTRUCTION}", answer=answer, sample_id=sid, environment=self.name)
            for sid, (problem, answer) in zip(ids, items, strict=True)
        ]

    def demonstration(self, sample: Sample) -> str | None:
        """The reference answer in the expected format, for the warm start."""
        return f"The answer is $\\boxed{{{sample.answer}}}$."

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        t0 = time.perf_counter()
        predicted = extract_boxed(completion)
        correct, method = check_answer(predicted, str(sample.answer), self.name) if predicted else (False, "none")
        return RewardResult(
            total_reward=float(correct),
            sample_metrics={
                "correct": float(correct),
                "has_boxed": float(predicted is not None),
                "math_verify_checked": float(method == "math_verify"),
                "response_chars": float(len(completion)),
                "reward_compute_time": time.perf_counter() - t0,
            },
        )


class HendrycksMathEnvironment(MathEnvironment):
    """The MATH dataset (Hendrycks et al.): train on the full train split by default."""

    name: ClassVar[str] = "hendrycks_math"
    default_dataset: ClassVar[str] = HENDRYCKS_MATH_DATASET
    default_split: ClassVar[str] = "train"
