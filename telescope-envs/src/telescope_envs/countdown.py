"""Countdown: combine the given numbers with + - * / to reach a target.

The prompt lists the numbers and the target; the model answers with an equation
inside ``<answer>...</answer>``. Reward (``reward_min`` 0, ``reward_max`` 2):

- format, 1.0: the last ``<answer>`` block holds an arithmetic expression (numbers,
  ``+ - * /`` and parentheses; an optional ``= target`` suffix is tolerated);
- correctness, 1.0: that expression uses every given number exactly once, and its
  exact (rational) value equals the target.

Parsing uses :mod:`ast` on a character-whitelisted string, never ``eval``; unary
minus, powers, names, calls and floats are rejected. Arithmetic is exact
(:class:`fractions.Fraction`), so ``(7 / 2) * 2`` equals 7 and division by zero is
simply wrong.

Data: ``dataset_name="Jiayi-Pan/Countdown-Tasks-3to4"`` (columns ``target`` and
``nums``; the upstream default), any local file with those columns, or
``"generated"``: ``num_samples`` solvable problems of ``num_numbers`` numbers from 1
to ``max_number``, built from a seeded random expression, offline and deterministic
(small values, e.g. 2 numbers up to 10, make a task a tiny model can learn).

``prompt_style``: ``"full"`` (the default) states the task in words;
``"compact"`` is ``"3 5 -> 8"``, for tiny models trained from scratch on a CPU.
``add_thinking_prefix``: the prompt ends with an open ``<think>`` assistant turn
(:mod:`telescope_envs._prompts`).
"""

from __future__ import annotations

import ast
import random
import re
import time
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, ClassVar

from telescope.api.environment import BaseEnvironment
from telescope.api.records import RewardResult, Sample
from telescope_envs._data import load_rows, stable_id, unique_ids
from telescope_envs._prompts import ThinkingPrefix

UPSTREAM_DATASET = "Jiayi-Pan/Countdown-Tasks-3to4"
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ALLOWED_CHARS = re.compile(r"^[\d\s+\-*/().]+$")
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class ExpressionError(ValueError):
    """The answer is not a plain arithmetic expression."""


def extract_answer(completion: str) -> str | None:
    """The content of the last ``<answer>...</answer>`` block, stripped (None if absent)."""
    matches = _ANSWER_RE.findall(completion)
    return matches[-1].strip() if matches else None


def parse_expression(text: str) -> tuple[Fraction, list[int]]:
    """Evaluate an arithmetic expression exactly; return (value, the numbers it uses).

    Raises :class:`ExpressionError` for anything but non-negative integer literals,
    ``+ - * /`` and parentheses, and for division by zero.
    """
    expr = text.strip()
    if "=" in expr:  # "1 + 2 = 3": keep the left side
        expr = expr.split("=", 1)[0].strip()
    if not expr or len(expr) > 200 or not _ALLOWED_CHARS.match(expr) or "**" in expr or "//" in expr:
        raise ExpressionError(f"not an arithmetic expression: {text[:80]!r}")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"cannot parse {expr!r}") from exc
    numbers: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            numbers.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if right == 0:
                raise ExpressionError("division by zero")
            return left / right
        raise ExpressionError(f"{type(node).__name__} is not allowed in a countdown answer")

    value = walk(tree.body)
    return value, numbers


def score_answer(completion: str, nums: Sequence[int], target: int) -> dict[str, float]:
    """The reward components of one completion: format, correct, uses_all_numbers, reaches_target."""
    answer = extract_answer(completion)
    result = {"format": 0.0, "correct": 0.0, "uses_all_numbers": 0.0, "reaches_target": 0.0}
    if answer is None:
        return result
    try:
        value, used = parse_expression(answer)
    except ExpressionError:
        return result
    result["format"] = 1.0
    uses_all = Counter(used) == Counter(int(n) for n in nums)
    reaches = value == target
    result["uses_all_numbers"] = float(uses_all)
    result["reaches_target"] = float(reaches)
    result["correct"] = float(uses_all and reaches)
    return result


def generate_problems(
    num_samples: int, num_numbers: int = 3, max_number: int = 10, seed: int = 0
) -> list[tuple[list[int], int]]:
    """Solvable problems: random numbers combined by a random expression whose value is the target.

    Every intermediate value stays a positive integer (division only when exact), so
    each target has a solution using all numbers once. Deterministic for a seed.
    """
    if num_numbers < 2 or max_number < 2 or num_samples < 1:
        raise ValueError("generated countdown needs num_samples >= 1, num_numbers >= 2 and max_number >= 2")
    rng = random.Random(seed)
    problems: list[tuple[list[int], int]] = []
    while len(problems) < num_samples:
        nums = [rng.randint(1, max_number) for _ in range(num_numbers)]
        values = [Fraction(n) for n in nums]
        rng.shuffle(values)
        while len(values) > 1:
            a, b = values.pop(), values.pop()
            candidates = [a + b, a * b]
            if a > b:
                candidates.append(a - b)
            if b > a:
                candidates.append(b - a)
            if b != 0 and (a / b).denominator == 1:
                candidates.append(a / b)
            if a != 0 and (b / a).denominator == 1:
                candidates.append(b / a)
            values.insert(rng.randrange(len(values) + 1), rng.choice(candidates))
        target = values[0]
        if target.denominator == 1 and 0 < target <= max(100, max_number * num_numbers * 2):
            problems.append((nums, int(target)))
    return problems


def solve(nums: Sequence[int], target: int) -> str | None:
    """An expression that uses every number once and equals ``target`` (None if there is none).

    Exhaustive search over the ways to combine two values at a time (exact
    arithmetic); meant for the small problems of a warm start (2 to 4 numbers).
    """

    def search(items: list[tuple[Fraction, str]]) -> str | None:
        if len(items) == 1:
            return items[0][1] if items[0][0] == target else None
        for i in range(len(items)):
            for j in range(len(items)):
                if i == j:
                    continue
                (a, ea), (b, eb) = items[i], items[j]
                rest = [items[k] for k in range(len(items)) if k not in (i, j)]
                options = [(a + b, f"{ea} + {eb}"), (a - b, f"{ea} - {eb}"), (a * b, f"{ea} * {eb}")]
                if b != 0:
                    options.append((a / b, f"{ea} / {eb}"))
                for value, text in options:
                    found = search([*rest, (value, f"({text})" if rest else text)])
                    if found is not None:
                        return found
        return None

    return search([(Fraction(n), str(n)) for n in nums])


def load_problems(source: Any) -> list[tuple[list[int], int]]:
    """The (numbers, target) problems ``source``'s data settings name.

    ``source`` has ``dataset_name`` (``"generated"`` or a file / hub dataset with ``nums`` and
    ``target``), ``dataset_split``, ``num_samples``, ``num_numbers``, ``max_number``, ``seed`` and
    ``max_samples``: the settings Countdown and its agent variant share.
    """
    if source.dataset_name == "generated":
        problems = generate_problems(source.num_samples, source.num_numbers, source.max_number, source.seed)
    else:
        rows = load_rows(source.dataset_name, source.dataset_split, fields=("nums", "target"))
        problems = [([int(n) for n in row["nums"]], int(row["target"])) for row in rows]
    return problems if source.max_samples is None else problems[: source.max_samples]


class CountdownEnvironment(ThinkingPrefix, BaseEnvironment):
    """Reach the target with the given numbers; reward = format (0/1) + correct (0/1)."""

    name: ClassVar[str] = "countdown"
    metrics_ranges: ClassVar[dict[str, dict[str, float]]] = {
        "format": {"min": 0.0, "max": 1.0},
        "correct": {"min": 0.0, "max": 1.0},
        "uses_all_numbers": {"min": 0.0, "max": 1.0},
        "reaches_target": {"min": 0.0, "max": 1.0},
    }
    reward_min: ClassVar[float] = 0.0
    reward_max: ClassVar[float] = 2.0
    data_files: ClassVar[dict[str, tuple[str, ...]]] = {"dataset_name": ("nums", "target")}

    def __init__(
        self,
        dataset_name: str = UPSTREAM_DATASET,
        dataset_split: str = "train",
        num_samples: int = 1000,
        num_numbers: int = 3,
        max_number: int = 10,
        seed: int = 0,
        max_samples: int | None = None,
        prompt_style: str = "full",
        add_thinking_prefix: bool = False,
    ) -> None:
        if prompt_style not in ("full", "compact"):
            raise ValueError(f"countdown: prompt_style must be 'full' or 'compact', not {prompt_style!r}")
        self.prompt_style = prompt_style
        self.add_thinking_prefix = add_thinking_prefix
        self.dataset_name = dataset_name
        self.dataset_split = dataset_split
        self.num_samples = num_samples
        self.num_numbers = num_numbers
        self.max_number = max_number
        self.seed = seed
        self.max_samples = max_samples

    def render_prompt(self, nums: Sequence[int], target: int) -> str:
        if self.prompt_style == "compact":
            # For tiny models: the numbers and the target up front, few tokens to attend over.
            return f"{' '.join(map(str, nums))} -> {target}"
        return (
            f"Using the numbers {list(nums)}, create an equation that equals {target}. "
            "You can use + - * / and parentheses, and must use each number exactly once. "
            "Think it through, then give only the final equation inside <answer> </answer> tags, "
            "for example <answer>(1 + 2) * 3</answer>."
        )

    def load_dataset(self) -> list[Sample]:
        problems = load_problems(self)
        ids = unique_ids([stable_id("countdown", nums, target) for nums, target in problems])
        return [
            Sample(
                prompt=self.render_prompt(nums, target),
                answer={"nums": nums, "target": target},
                sample_id=sid,
                environment=self.name,
            )
            for sid, (nums, target) in zip(ids, problems, strict=True)
        ]

    def demonstration(self, sample: Sample) -> str | None:
        """A correct answer for the warm start, found by exhaustive search."""
        expression = solve(sample.answer["nums"], sample.answer["target"])
        return None if expression is None else f"<answer>{expression}</answer>"

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        t0 = time.perf_counter()
        parts = score_answer(completion, sample.answer["nums"], sample.answer["target"])
        metrics = dict(parts)
        metrics["response_chars"] = float(len(completion))
        metrics["reward_compute_time"] = time.perf_counter() - t0
        return RewardResult(total_reward=parts["format"] + parts["correct"], sample_metrics=metrics)
