"""The CPU deepdive example's world: what its script writes, and that one search answers each question."""

from __future__ import annotations

import json
import re
from pathlib import Path

from data_scripts import DATA, data_script

from telescope_envs.deepdive import DeepDiveEnvironment

QUESTIONS = DATA / "deepdive_islands.jsonl"
CORPUS = DATA / "deepdive_islands_corpus.jsonl"


def _rows(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_shipped_files_are_what_their_script_writes() -> None:
    corpus, questions = data_script("make_deepdive_islands").world()
    assert _rows(CORPUS) == corpus and _rows(QUESTIONS) == questions


def test_one_question_an_island_so_held_out_islands_are_unseen() -> None:
    islands = [re.sub(r"^.* (?:of|on|is) ", "", q["question"]).rstrip("?") for q in _rows(QUESTIONS)]
    islands = [name.removeprefix("Who founded ") for name in islands]
    titles = {row["title"] for row in _rows(CORPUS)}
    assert len(islands) == len(set(islands)) == len(titles) == 1600 and set(islands) == titles


def test_the_first_search_result_shows_each_answer() -> None:
    env = DeepDiveEnvironment(
        dataset_name=str(QUESTIONS),
        dataset_split="train",
        dataset_test_size=0.0,
        search_backend="local",
        page_backend="local",
        corpus=str(CORPUS),
        max_search_results=1,
        judge_backend="match",
    )
    for sample in env.load_dataset():
        result = env.search_web([str(sample.prompt)])
        shown = result.splitlines()[-1]  # the first result's snippet: the page's line nearest the question
        assert result.count("Result ") == 1 and str(sample.answer) in shown, (sample.prompt, result)
