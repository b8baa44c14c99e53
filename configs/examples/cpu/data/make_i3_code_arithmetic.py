"""Write ``i3_code_train.jsonl``: the CPU i3_code example's programming problems, in the INTELLECT-3 code format.

Each row has the columns the ``i3_code`` environment reads from the real set: the
``question``, ``verification_info`` with stdin/stdout ``test_cases`` (three per problem)
and a reference ``solution`` (the warm start's demonstration). The problems are ones
the tiny CPU model can learn in minutes: read an integer and print it plus, minus,
times or modulo a constant, or print a constant. Each constant appears once per kind,
so a problem held out of training (the eval's ``separate_eval_samples``) asks for a
program no training problem asks for; what carries over is the program's shape and
copying the constant from the question. The rows are drawn and shuffled with a fixed
seed, so the file is the same on every run of this script::

    python configs/examples/cpu/data/make_i3_code_arithmetic.py   # rewrites the file beside it
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

OUT = Path(__file__).with_name("i3_code_train.jsonl")

#: Kind -> (question template, solution template, the answer to input n for constant k).
KINDS: dict[str, tuple[str, str, Callable[[int, int], int]]] = {
    "plus": ("Read an integer n and print n + {k}.", "print(int(input()) + {k})", lambda n, k: n + k),
    "minus": ("Read an integer n and print n - {k}.", "print(int(input()) - {k})", lambda n, k: n - k),
    "times": ("Read an integer n and print n * {k}.", "print(int(input()) * {k})", lambda n, k: n * k),
    "modulo": ("Read an integer n and print n % {k}.", "print(int(input()) % {k})", lambda n, k: n % k),
    "constant": ("Read an integer n and print {k}.", "input()\nprint({k})", lambda n, k: k),
}


def problem(kind: str, k: int, draw: random.Random) -> dict[str, object]:
    question, solution, answer = KINDS[kind]
    inputs = draw.sample(range(0, 1000), 3)
    return {
        "question": question.format(k=k),
        "verification_info": {
            "test_cases": {
                "inputs": [f"{n}\n" for n in inputs],
                "outputs": [f"{answer(n, k)}\n" for n in inputs],
            }
        },
        "solution": solution.format(k=k),
    }


def code_rows() -> list[dict[str, object]]:
    """Every kind with every constant 2..99, drawn and shuffled with seed 0: the same rows on every run."""
    draw = random.Random(0)
    rows = [problem(kind, k, draw) for kind in KINDS for k in range(2, 100)]
    draw.shuffle(rows)
    return rows


def main() -> None:
    OUT.write_text("".join(json.dumps(row) + "\n" for row in code_rows()))


if __name__ == "__main__":
    main()
