"""A tool-calling example on :class:`~telescope.api.tools.ToolEnvironment`: a calculator.

The model gets an arithmetic word problem and two tools, ``add`` and ``subtract``.
It calls them with ``<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>``
(the Hermes/Qwen convention), reads the results, and ends with its final answer in
``<answer>...</answer>`` in a reply without a tool call.

Reward (0 or 1): the final answer equals the reference (numerically). Sample metrics:
``correct`` and everything :meth:`~telescope.api.tools.ToolEnvironment.get_tool_metrics`
reports (``total_tool_calls``, ``tool_success_count``, ``tool_error_count``,
``tool_success_rate``, ``unique_tools_used``, ``add_calls``, ``subtract_calls``); these
count the calls of this rollout only, kept in its ``RolloutState``.

Data: ``dataset_name="generated"`` (default; ``num_samples`` problems of
``num_terms`` numbers up to ``max_number``, seeded) or a file/hub dataset with
``question`` and ``answer`` columns.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any, ClassVar

from telescope.api.environment import RolloutState
from telescope.api.records import Message, RewardResult, Sample
from telescope.api.tools import ToolEnvironment
from telescope_envs._data import load_rows, stable_id, unique_ids

_ANSWER_RE = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def subtract(a: float, b: float) -> float:
    """Subtract the second number from the first.

    Args:
        a: the number to subtract from
        b: the number to subtract
    """
    return a - b


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return None


class CalculatorEnvironment(ToolEnvironment):
    """Arithmetic with ``add`` and ``subtract`` tools; reward 1.0 for the right final answer."""

    name: ClassVar[str] = "calculator"
    data_files: ClassVar[dict[str, tuple[str, ...]]] = {"dataset_name": ("question", "answer")}
    tools: ClassVar[list[Any]] = [add, subtract]
    max_turns: ClassVar[int] = 6
    metrics_ranges: ClassVar[dict[str, dict[str, float]]] = {
        "correct": {"min": 0.0, "max": 1.0},
        "tool_success_rate": {"min": 0.0, "max": 1.0},
    }

    def __init__(
        self,
        dataset_name: str = "generated",
        dataset_split: str = "train",
        num_samples: int = 200,
        num_terms: int = 3,
        max_number: int = 100,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.dataset_name = dataset_name
        self.dataset_split = dataset_split
        self.num_samples = num_samples
        self.num_terms = num_terms
        self.max_number = max_number
        self.seed = seed

    def _generate(self) -> list[tuple[str, float]]:
        rng = random.Random(self.seed)
        items = []
        for _ in range(self.num_samples):
            nums = [rng.randint(1, self.max_number) for _ in range(self.num_terms)]
            expr, value = str(nums[0]), float(nums[0])
            for n in nums[1:]:
                if rng.random() < 0.5:
                    expr, value = f"{expr} + {n}", value + n
                else:
                    expr, value = f"{expr} - {n}", value - n
            items.append((f"What is {expr}?", value))
        return items

    def load_dataset(self) -> list[Sample]:
        if self.dataset_name == "generated":
            items = self._generate()
        else:
            rows = load_rows(self.dataset_name, self.dataset_split, fields=self.data_files["dataset_name"])
            items = [(str(r["question"]), float(r["answer"])) for r in rows]
        ids = unique_ids([stable_id(self.name, q) for q, _ in items])
        return [
            Sample(prompt=q, answer=a, sample_id=sid, environment=self.name)
            for sid, (q, a) in zip(ids, items, strict=True)
        ]

    def format_prompt(self, sample: Sample) -> list[Message]:
        tools = "\n".join(json.dumps(schema) for schema in self.tool_schemas)
        system = (
            "You can use these tools:\n"
            f"{tools}\n"
            'Call a tool with <tool_call>{"name": <tool name>, "arguments": {...}}</tool_call>. '
            "When you know the result, reply without a tool call and give it as <answer>number</answer>."
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": str(sample.prompt)}]

    def compute_reward(self, messages: list[Message], sample: Sample, state: RolloutState) -> RewardResult:
        final = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
        answers = _ANSWER_RE.findall(str(final.get("content", ""))) if final else []
        value = _number(answers[-1]) if answers else None
        correct = value is not None and abs(value - float(sample.answer)) < 1e-6
        metrics = {k: float(v) for k, v in self.get_tool_metrics(state).items()}
        metrics["correct"] = float(correct)
        return RewardResult(total_reward=float(correct), sample_metrics=metrics)
