"""GPQA (diamond): graduate-level multiple choice, the letter in ``\\boxed{}``.

Rows have ``Question``, ``Correct Answer`` and ``Incorrect Answer 1..3`` (the
upstream ``Idavidrein/gpqa`` layout, config ``gpqa_diamond``). The four choices are
shuffled with a seed derived from the question, so a sample's letter order is the
same on every run and machine. The model answers with ``\\boxed{C}`` (or a final
``Answer: C`` line); reward 1.0 when the letter is right.
"""

from __future__ import annotations

import random
import re
import time
from typing import ClassVar

from telescope.api.environment import BaseEnvironment
from telescope.api.records import RewardResult, Sample
from telescope_envs._data import load_rows, stable_id, unique_ids
from telescope_envs.math_answers import extract_boxed

GPQA_DATASET = "Idavidrein/gpqa"
LETTERS = "ABCD"
_ANSWER_LINE = re.compile(r"answer\s*(?:is|:)?\s*\(?([ABCD])\)?\b", re.IGNORECASE)


def extract_choice(completion: str) -> str | None:
    """The chosen letter: the last ``\\boxed{X}``, else the last "Answer: X"."""
    boxed = extract_boxed(completion)
    if boxed is not None:
        m = re.fullmatch(r"\(?\s*(?:\\text\{)?\s*([ABCDabcd])\s*\}?\s*\)?", boxed.strip())
        return m.group(1).upper() if m else None
    found = _ANSWER_LINE.findall(completion)
    return found[-1].upper() if found else None


class GPQAEnvironment(BaseEnvironment):
    """Four-way multiple choice; reward 1.0 for the right letter."""

    name: ClassVar[str] = "gpqa"
    data_files: ClassVar[dict[str, tuple[str, ...]]] = {
        "dataset_name": ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
    }
    metrics_ranges: ClassVar[dict[str, dict[str, float]]] = {
        "correct": {"min": 0.0, "max": 1.0},
        "answered": {"min": 0.0, "max": 1.0},
    }

    def __init__(
        self,
        dataset_name: str = GPQA_DATASET,
        dataset_split: str = "train",
        dataset_subset: str | None = "gpqa_diamond",
        max_samples: int | None = None,
    ) -> None:
        self.dataset_name = dataset_name
        self.dataset_split = dataset_split
        self.dataset_subset = dataset_subset
        self.max_samples = max_samples

    def load_dataset(self) -> list[Sample]:
        subset = None if self.dataset_name.endswith((".json", ".jsonl", ".csv", ".parquet")) else self.dataset_subset
        rows = load_rows(self.dataset_name, self.dataset_split, subset, fields=self.data_files["dataset_name"])
        if self.max_samples is not None:
            rows = rows[: self.max_samples]
        ids = unique_ids([stable_id(self.name, str(r["Question"])) for r in rows])
        samples = []
        for sid, row in zip(ids, rows, strict=True):
            correct = str(row["Correct Answer"]).strip()
            choices = [correct] + [str(row[f"Incorrect Answer {i}"]).strip() for i in (1, 2, 3)]
            random.Random(sid).shuffle(choices)
            letter = LETTERS[choices.index(correct)]
            options = "\n".join(f"{LETTERS[i]}) {c}" for i, c in enumerate(choices))
            prompt = (
                f"{str(row['Question']).strip()}\n\n{options}\n\n"
                "Think step by step, then give the letter of the right choice within \\boxed{}, e.g. \\boxed{A}."
            )
            samples.append(Sample(prompt=prompt, answer=letter, sample_id=sid, environment=self.name))
        return samples

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        t0 = time.perf_counter()
        choice = extract_choice(completion)
        correct = choice == sample.answer
        return RewardResult(
            total_reward=float(correct),
            sample_metrics={
                "correct": float(correct),
                "answered": float(choice is not None),
                "reward_compute_time": time.perf_counter() - t0,
            },
        )
