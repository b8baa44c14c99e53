"""Write ``math_arithmetic.jsonl``: the CPU hendrycks_math examples' problems, in the MATH train set's format.

Each row has the MATH train set's columns (``problem``, ``solution`` ending in a
``\\boxed{}`` answer, ``level``, ``type``), so the ``hendrycks_math`` environment reads it
as it reads the real dataset. The problems are ones the tiny CPU model can learn in
minutes, most of them by reading the answer's digits off the prompt: the larger or the
smaller of two two-digit numbers (600 each), a multiple of 100 plus a two-digit number
(500), a number below 100 times ten (99), and the sums of two digits (100), which have to
be known. The rows are drawn and shuffled with a fixed seed, so the file is the same on
every run of this script::

    python configs/examples/cpu/data/make_math_arithmetic.py   # rewrites the file beside it
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).with_name("math_arithmetic.jsonl")


def _row(problem: str, answer: str, level: int, kind: str) -> dict[str, str]:
    return {
        "problem": problem,
        "solution": f"The answer is $\\boxed{{{answer}}}$.",
        "level": f"Level {level}",
        "type": kind,
    }


def arithmetic_rows() -> list[dict[str, str]]:
    """The problems, drawn and shuffled with seed 0: the same rows on every run."""
    draw = random.Random(0)
    rows: list[dict[str, str]] = []
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100) if a != b]
    for a, b in draw.sample(pairs, 600):
        rows.append(_row(f"What is the larger of ${a}$ and ${b}$?", str(max(a, b)), 1, "Prealgebra"))
    for a, b in draw.sample(pairs, 600):
        rows.append(_row(f"What is the smaller of ${a}$ and ${b}$?", str(min(a, b)), 1, "Prealgebra"))
    hundreds = [(a, b) for a in range(100, 1000, 100) for b in range(10, 100)]
    for a, b in draw.sample(hundreds, 500):
        rows.append(_row(f"What is ${a} + {b}$?", str(a + b), 1, "Prealgebra"))
    rows += [_row(f"What is ${a} \\cdot 10$?", str(a * 10), 1, "Prealgebra") for a in range(1, 100)]
    rows += [_row(f"What is ${a} + {b}$?", str(a + b), 1, "Prealgebra") for a in range(10) for b in range(10)]
    draw.shuffle(rows)
    return rows


def main() -> None:
    OUT.write_text("".join(json.dumps(row) + "\n" for row in arithmetic_rows()))


if __name__ == "__main__":
    main()
