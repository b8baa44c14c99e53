"""The CPU i3_code example's problems: what their script writes, each reference solution passing its own tests."""

from __future__ import annotations

import json
import subprocess
import sys

from data_scripts import DATA, data_script

from telescope_envs.i3_code import I3CodeEnvironment

PROBLEMS = DATA / "i3_code_train.jsonl"


def test_the_shipped_file_is_what_its_script_writes() -> None:
    rows = [json.loads(line) for line in PROBLEMS.read_text().splitlines()]
    assert rows == data_script("make_i3_code_arithmetic").code_rows()
    assert len({row["question"] for row in rows}) == len(rows) == 490  # each problem once: held-out ones are unseen


def test_each_reference_solution_passes_its_tests() -> None:
    """All 1,470 tests run in one Python process, each solution exec-ed on its input: they are one-liners."""
    samples = I3CodeEnvironment(dataset_name=str(PROBLEMS)).load_dataset()
    programs = [(s.answer["solution"], t["input"], t["output"]) for s in samples for t in s.answer["tests"]]
    runner = (
        "import io, json, sys, contextlib\n"
        "failed = []\n"
        "for code, given, want in json.load(sys.stdin):\n"
        "    sys.stdin = io.StringIO(given); out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out): exec(code, {})\n"
        "    if out.getvalue() != want: failed.append([code, given, out.getvalue(), want])\n"
        "sys.stdout.write(json.dumps(failed))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", runner], input=json.dumps(programs), capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == [] and len(programs) == 3 * 490
