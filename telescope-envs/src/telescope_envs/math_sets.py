"""Two more competition-math training sets on the shared math environment: ``dapo_math`` and ``deepscaler``.

Both are :class:`~telescope_envs.hendrycks_math.MathEnvironment` with another dataset:
the prompt is the problem followed by the boxed-answer instruction, and the reward
(0 or 1) is a math-verify check of the completion's final answer against the
dataset's verified answer (:func:`telescope_envs.math_answers.answers_match`).

``dapo_math``: DAPO-Math-17k (``BytedTsinghua-SIA/DAPO-Math-17k``, the DAPO paper's
set; integer answers). Each row holds a chat ``prompt`` whose first message wraps the
problem in an instruction to end with an ``Answer: ...`` line, and the answer in
``reward_model.ground_truth`` (a dict or its JSON text). The wrapper is removed
(``strip_dataset_instructions``), so the model sees one instruction, the boxed one; the
reward takes the last ``\\boxed{}`` and, when there is none, the last ``Answer:``
line, so a model that follows the dataset's own convention is still scored. The hub
copy repeats each problem many times; ``deduplicate`` keeps the first of identical
(problem, answer) rows. Sample metric ``answer_line``: the answer came from an
``Answer:`` line.

``deepscaler``: DeepScaleR-Preview (``agentica-org/DeepScaleR-Preview-Dataset``;
columns ``problem``, ``answer``, ``solution``): the ``answer`` column is the
reference.

Both load through ``datasets.load_dataset`` (hub names as upstream; local ``.jsonl``
or ``.parquet`` files with the same columns, which is what the tests use) and need
``math-verify`` to score (``pip install 'telescope-envs[math]'``).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, ClassVar

from telescope.api.records import RewardResult, Sample
from telescope_envs._data import load_rows, stable_id, unique_ids
from telescope_envs.hendrycks_math import INSTRUCTION, MathEnvironment
from telescope_envs.math_answers import answers_match, extract_boxed

DAPO_MATH_DATASET = "BytedTsinghua-SIA/DAPO-Math-17k"
DEEPSCALER_DATASET = "agentica-org/DeepScaleR-Preview-Dataset"

#: The instruction DAPO-Math-17k wraps around every problem (before and after it).
_DAPO_PREFIX = re.compile(r"^\s*Solve the following math problem step by step\..*?to the problem\.\s*", re.DOTALL)
_DAPO_SUFFIX = re.compile(r"\s*Remember to put your answer on its own line after \"Answer:\"\.?\s*$", re.DOTALL)
_ANSWER_LINE = re.compile(r"^[ \t*#>]*answer[ \t*]*:[ \t]*(.+?)[ \t]*$", re.IGNORECASE | re.MULTILINE)


def strip_dapo_instructions(text: str) -> str:
    """The problem of a DAPO-Math-17k prompt without the dataset's ``Answer:`` instruction around it."""
    return _DAPO_SUFFIX.sub("", _DAPO_PREFIX.sub("", text, count=1), count=1).strip()


def extract_answer_line(text: str) -> str | None:
    """The value of the last ``Answer: ...`` line (``$`` and a trailing period removed), or None."""
    found = _ANSWER_LINE.findall(text)
    if not found:
        return None
    value = found[-1].strip().strip("*").strip()
    if value.startswith("$") and value.endswith("$") and len(value) > 1:
        value = value.strip("$").strip()
    value = value.rstrip(".").strip()
    boxed = extract_boxed(value)
    return (boxed if boxed is not None else value) or None


def _dapo_question(row: dict[str, Any]) -> str | None:
    prompt = row.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        content = prompt[0].get("content")
        return content if isinstance(content, str) and content.strip() else None
    return prompt if isinstance(prompt, str) and prompt.strip() else None


def _dapo_answer(row: dict[str, Any]) -> str | None:
    spec = row.get("reward_model")
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError:
            return None
    if not isinstance(spec, dict):
        return None
    truth = spec.get("ground_truth")
    if isinstance(truth, (int, float)) and not isinstance(truth, bool):
        truth = str(truth)
    return truth.strip() if isinstance(truth, str) and truth.strip() else None


class DapoMathEnvironment(MathEnvironment):
    """DAPO-Math-17k: boxed (or ``Answer:`` line) final answer, checked by math-verify."""

    name: ClassVar[str] = "dapo_math"
    metrics_ranges: ClassVar[dict[str, dict[str, float]]] = {
        **MathEnvironment.metrics_ranges,
        "answer_line": {"min": 0.0, "max": 1.0},
    }
    default_dataset: ClassVar[str] = DAPO_MATH_DATASET
    default_split: ClassVar[str] = "train"

    def __init__(
        self,
        dataset_name: str | None = None,
        dataset_split: str | None = None,
        dataset_subset: str | None = None,
        max_samples: int | None = None,
        deduplicate: bool = True,
        strip_dataset_instructions: bool = True,
        add_thinking_prefix: bool = False,
    ) -> None:
        super().__init__(
            dataset_name=dataset_name,
            dataset_split=dataset_split,
            dataset_subset=dataset_subset,
            max_samples=max_samples,
            add_thinking_prefix=add_thinking_prefix,
        )
        self.deduplicate = deduplicate
        self.strip_dataset_instructions = strip_dataset_instructions

    def load_dataset(self) -> list[Sample]:
        rows = load_rows(self.dataset_name, self.dataset_split, self.dataset_subset)
        items: list[tuple[str, str]] = []
        seen: set[tuple[str, str]] = set()
        for row in rows:
            question, answer = _dapo_question(row), _dapo_answer(row)
            if question is None or answer is None:
                continue  # nothing to ask or nothing to check against
            if self.strip_dataset_instructions:
                question = strip_dapo_instructions(question)
            if self.deduplicate:
                if (question, answer) in seen:
                    continue
                seen.add((question, answer))
            items.append((question, answer))
            if self.max_samples is not None and len(items) >= self.max_samples:
                break
        ids = unique_ids([stable_id(self.name, question) for question, _ in items])
        return [
            Sample(prompt=f"{question}\n\n{INSTRUCTION}", answer=answer, sample_id=sid, environment=self.name)
            for sid, (question, answer) in zip(ids, items, strict=True)
        ]

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        t0 = time.perf_counter()
        boxed = extract_boxed(completion)
        line = extract_answer_line(completion) if boxed is None else None
        predicted = boxed if boxed is not None else line
        correct = predicted is not None and answers_match(predicted, str(sample.answer), self.name)
        return RewardResult(
            total_reward=float(correct),
            sample_metrics={
                "correct": float(correct),
                "has_boxed": float(boxed is not None),
                "answer_line": float(line is not None),
                "response_chars": float(len(completion)),
                "reward_compute_time": time.perf_counter() - t0,
            },
        )


class DeepScalerEnvironment(MathEnvironment):
    """DeepScaleR-Preview: the ``answer`` column is the reference for the boxed answer."""

    name: ClassVar[str] = "deepscaler"
    default_dataset: ClassVar[str] = DEEPSCALER_DATASET
    default_split: ClassVar[str] = "train"

    def __init__(
        self,
        dataset_name: str | None = None,
        dataset_split: str | None = None,
        dataset_subset: str | None = None,
        max_samples: int | None = None,
        add_thinking_prefix: bool = False,
    ) -> None:
        super().__init__(
            dataset_name=dataset_name,
            dataset_split=dataset_split,
            dataset_subset=dataset_subset,
            problem_column="problem",
            answer_column="answer",
            solution_column="solution",
            max_samples=max_samples,
            add_thinking_prefix=add_thinking_prefix,
        )
