"""Write the CPU deepdive example's world: ``deepdive_islands_corpus.jsonl`` and ``deepdive_islands.jsonl``.

An invented archipelago of 1,600 islands, one page each (``corpus://island/<name>``) with
four facts in a shuffled order: the island's capital, its highest mountain, its sea and
who founded it. ``deepdive_islands.jsonl`` has one question per island (``question``,
``answer``), about one of the four facts, drawn at random, so a question held out of
training is about an island training never asked about. Every answer is on the island's
own page, in the line that shares the most words with the question, which is the snippet
BM25 search shows for the page (``telescope_envs.deepdive.corpus``): one search with the
question as the query, then reading the answer off the first result, solves it. That is
a skill the tiny CPU model can learn in minutes and carry to islands it has not seen.

Names are made of syllables, drawn with a fixed seed and all different, so the files are
the same on every run of this script::

    python configs/examples/cpu/data/make_deepdive_islands.py   # rewrites the files beside it
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
CORPUS = HERE / "deepdive_islands_corpus.jsonl"
QUESTIONS = HERE / "deepdive_islands.jsonl"
ISLANDS = 1600
SYLLABLES = [
    "ka",
    "lo",
    "ven",
    "dra",
    "mir",
    "tes",
    "sa",
    "bor",
    "nel",
    "fi",
    "ru",
    "gan",
    "to",
    "vel",
    "ash",
    "mar",
    "lin",
    "dor",
    "is",
    "tal",
    "quen",
    "bri",
    "od",
    "hal",
    "sun",
    "pe",
    "rak",
    "ul",
]
FIRST_NAMES = ["Ada", "Bram", "Cora", "Dov", "Elin", "Fenn", "Greta", "Hugo", "Ines", "Jory", "Kaja", "Lev"]


class Names:
    """Names never drawn before (of any kind), two or three syllables, capitalised."""

    def __init__(self, draw: random.Random) -> None:
        self.draw = draw
        self.taken: set[str] = set()

    def new(self) -> str:
        while True:
            name = "".join(self.draw.choice(SYLLABLES) for _ in range(self.draw.choice((2, 3)))).capitalize()
            if name not in self.taken:
                self.taken.add(name)
                return name


def world() -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(corpus rows, question rows), drawn with seed 0: the same on every run."""
    draw = random.Random(0)
    names = Names(draw)
    seas = [names.new() for _ in range(12)]
    corpus: list[dict[str, str]] = []
    questions: list[dict[str, str]] = []
    for _ in range(ISLANDS):
        island, capital, mountain = names.new(), names.new(), names.new()
        sea, founder = draw.choice(seas), f"{draw.choice(FIRST_NAMES)} {names.new()}"
        facts = [
            (f"The capital of {island} is {capital}.", f"What is the capital of {island}?", capital),
            (
                f"The highest mountain on {island} is Mount {mountain}.",
                f"What is the highest mountain on {island}?",
                f"Mount {mountain}",
            ),
            (f"{island} is in the Sea of {sea}.", f"In which sea is {island}?", sea),
            (f"{island} was founded by {founder}.", f"Who founded {island}?", founder),
        ]
        lines = [line for line, _, _ in facts]
        draw.shuffle(lines)
        corpus.append({"url": f"corpus://island/{island.lower()}", "title": island, "text": "\n".join(lines)})
        _, question, answer = draw.choice(facts)
        questions.append({"question": question, "answer": answer})
    return corpus, questions


def _write(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    corpus_rows, question_rows = world()
    _write(CORPUS, corpus_rows)
    _write(QUESTIONS, question_rows)
    print(f"{len(corpus_rows)} pages -> {CORPUS}, {len(question_rows)} questions -> {QUESTIONS}")
