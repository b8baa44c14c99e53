"""Every upstream example runs (issue 15): the GPU recipes validate, their CPU variants train through Ray.

``configs/examples/example_*.yaml`` are the upstream GPU recipes; each is checked with
``telescope config validate`` (fast). ``configs/examples/cpu/*_tiny.yaml`` are their CPU
variants (the tiny local model, a small local data file, a few steps); each runs here
through ``telescope run`` in a subprocess, as a user would, and the run store is read
back for what the example is about:

- hendrycks_math: completions scored by the boxed-answer check, math-verify deciding
  the answers that are not a plain string match;
- hendrycks_math with evals: periodic evals on the dedicated eval server, every request
  of an eval at step s served by the weights of step s;
- wordle: multi-turn games whose every turn's request is the whole trajectory so far
  (earlier tokens reused, only the feedback's tokens added);
- i3_code: programs run in the local sandbox, its events in the run store;
- deepdive: research episodes whose tool calls (BM25 search and pages over the example's
  invented islands) run between the model's turns, answers graded by the string-match judge.

Each run is short (a warm start of 40-250 supervised steps, 3-4 RL steps) and marked slow.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from telescope.recording.run_reader import RunReader
from telescope.testing.processes import leftovers_after

pytestmark = pytest.mark.requires_dist("telescope-envs", "telescope-sandbox")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "configs" / "examples"
CPU = EXAMPLES / "cpu"
CLI = "import sys; from telescope.cli.main import main; sys.exit(main(sys.argv[1:]))"


def telescope(*args: str, timeout: float = 840) -> subprocess.CompletedProcess[str]:
    """The CLI in a subprocess from the repository root (the examples' data paths are relative to it)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "TELESCOPE_PROGRESS": "lines"}
    return subprocess.run(
        [sys.executable, "-c", CLI, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env
    )


def run_example(name: str, run_dir: Path, port: int, *args: str) -> RunReader:
    """Train ``cpu/<name>.yaml`` on a Ray cluster of its own; returns the completed run's reader."""
    result = telescope(
        "run",
        str(CPU / f"{name}.yaml"),
        "--run_dir",
        str(run_dir),
        "--ray_address",
        "local",
        "--inference_base_port",
        str(port),
        *args,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    reader = RunReader(run_dir)
    assert reader.status()["status"] == "completed"
    assert leftovers_after(str(run_dir)) == []
    return reader


# ---------------------------------------------------------------------- the GPU recipes


@pytest.mark.parametrize(
    "name", ["countdown", "countdown_agent", "hendrycks_math", "hendrycks_math_with_eval", "wordle", "i3_code"]
)
def test_every_upstream_recipe_is_shipped_and_validates(name: str) -> None:
    config = EXAMPLES / f"example_{name}.yaml"
    result = telescope("config", "validate", str(config), timeout=120)
    if name == "i3_code" and result.returncode != 0:
        # its provider is daytona: without its SDK that is the one problem, named with its fix
        assert result.returncode == 2 and "'daytona'" in result.stderr, result.stderr
        assert "pip install 'telescope-sandbox[daytona]'" in result.stderr and result.stderr.count("error:") == 1
        result = telescope("config", "validate", str(config), "--sandbox_provider", "local", timeout=120)
    assert result.returncode == 0, result.stderr
    if name != "countdown":
        assert (CPU / f"{name}_tiny.yaml").exists(), f"example_{name}.yaml has no CPU variant"


# ---------------------------------------------------------------------- the CPU variants

#: The math examples learn over 150 steps after a 400-step warm start (tests/e2e/test_examples_learn.py);
#: what these tests check needs a few steps of a short, fast warm start (the \boxed{} format) and small groups.
MATH_MECHANICS = (
    "--number_of_steps",
    "3",
    "--warm_start_steps",
    "60",
    "--warm_start_learning_rate",
    "3e-3",
    "--group_size",
    "4",
    "--prompts_batch_size_for_trainer",
    "4",
    "--eval_before_training",
    "false",
    "--eval_after_training",
    "false",
)
#: Periodic evals every 2 steps, 8 problems each (the example's: every 50, 256 held-out problems).
MECHANICS_EVALS = (
    "[{name: math500, eval_every: 2, num_samples: 8, max_tokens: 32,"
    " kwargs: {dataset_name: configs/examples/cpu/data/math500_eval.jsonl, dataset_split: test}},"
    " {name: hendrycks_math, eval_every: 2, num_samples: 8, separate_eval_samples: true,"
    " kwargs: {dataset_name: configs/examples/cpu/data/math_arithmetic.jsonl, dataset_split: train}}]"
)


#: Three steps of 4 groups of 4, no evals: an example's learning run cut down to a mechanics check.
THREE_SMALL_STEPS = (
    "--group_size",
    "4",
    "--prompts_batch_size_for_trainer",
    "4",
    "--number_of_steps",
    "3",
    "--evals",
    "[]",
    "--eval_before_training",
    "false",
    "--eval_after_training",
    "false",
)


#: wordle_tiny as a mechanics check: a warm start of 40 steps of 8, enough for games of several turns
#: (the learning test, tests/e2e/test_examples_learn.py, runs the example as shipped), 3 small steps, no evals.
WORDLE_MECHANICS = ("--warm_start_steps", "40", "--warm_start_batch_size", "8", *THREE_SMALL_STEPS)


#: i3_code_tiny as a mechanics check: a warm start of 60 steps of 8 at 3e-3 teaches the ```python block
#: (the learning test, tests/e2e/test_examples_learn.py, runs the example as shipped), 3 small steps, no evals.
I3_CODE_MECHANICS = (
    "--warm_start_steps",
    "60",
    "--warm_start_batch_size",
    "8",
    "--warm_start_learning_rate",
    "3e-3",
    *THREE_SMALL_STEPS,
)


#: deepdive_tiny as a mechanics check: a warm start long enough to teach the search call (not the
#: reading that its learning test needs: tests/e2e/test_examples_learn.py), 3 small steps, no evals.
DEEPDIVE_MECHANICS = ("--warm_start_steps", "250", "--warm_start_batch_size", "8", *THREE_SMALL_STEPS)


@pytest.mark.slow
@pytest.mark.timeout(900)  # short on an idle machine; the limit leaves room for a loaded one
def test_hendrycks_math_scores_with_math_verify(tmp_path: Path) -> None:
    check_hendrycks_math(run_example("hendrycks_math_tiny", tmp_path / "run", 8241, *MATH_MECHANICS))


@pytest.mark.slow
@pytest.mark.timeout(900)  # short on an idle machine; the limit leaves room for a loaded one
def test_periodic_evals_run_on_the_eval_server_with_their_steps_weights(tmp_path: Path) -> None:
    check_hendrycks_math_with_eval(
        run_example(
            "hendrycks_math_with_eval_tiny",
            tmp_path / "run",
            8251,
            *MATH_MECHANICS,
            "--number_of_steps",
            "4",
            "--eval_before_training",
            "true",
            "--eval_after_training",
            "true",
            "--evals",
            MECHANICS_EVALS,
        )
    )


@pytest.mark.slow
@pytest.mark.timeout(900)  # short on an idle machine; the limit leaves room for a loaded one
def test_wordle_games_reuse_every_earlier_token_across_turns(tmp_path: Path) -> None:
    check_wordle(run_example("wordle_tiny", tmp_path / "run", 8261, *WORDLE_MECHANICS))


@pytest.mark.slow
@pytest.mark.timeout(900)  # short on an idle machine; the limit leaves room for a loaded one
def test_i3_code_runs_programs_in_the_local_sandbox(tmp_path: Path) -> None:
    check_i3_code(run_example("i3_code_tiny", tmp_path / "run", 8271, *I3_CODE_MECHANICS))


@pytest.mark.slow
@pytest.mark.timeout(900)  # short on an idle machine; the limit leaves room for a loaded one
def test_deepdive_researches_with_its_tools_between_turns(tmp_path: Path) -> None:
    check_deepdive(run_example("deepdive_tiny", tmp_path / "run", 8281, *DEEPDIVE_MECHANICS))


# ------------------------------------------------------- what each run store must show


def check_hendrycks_math(reader: RunReader) -> None:
    assert [m["step"] for m in reader.metrics()] == [0, 1, 2]
    rollouts = reader.rollouts()
    assert len(rollouts) == 3 * 4 * 4 and {r["environment"] for r in rollouts} == {"hendrycks_math"}
    assert all(r["error"] is None for r in rollouts)
    # the warm start taught the \boxed{} format; answers that are not a string match went to math-verify
    metrics = [r["sample_metrics"] for r in rollouts]
    assert sum(m["has_boxed"] for m in metrics) > 0
    assert sum(m["math_verify_checked"] for m in metrics) > 0, "math-verify decided no answer"
    assert any(e["kind"] == "reward.compute" for e in reader.events())


def check_hendrycks_math_with_eval(reader: RunReader) -> None:
    assert [m["step"] for m in reader.metrics()] == [0, 1, 2, 3]
    evals = reader.evals()
    assert [(e["phase"], e["step"]) for e in evals if e["name"] == "math500"] == [
        ("before", 0),
        ("periodic", 2),
        ("after", 4),
    ]
    assert {"eval/math500/correct_rate", "eval/hendrycks_math/reward_mean"} <= {k for e in evals for k in e["metrics"]}
    events = reader.events()
    runs = [e for e in events if e["kind"] == "eval.run"]
    assert {tuple(e["servers"]) for e in runs if e["phase"] == "periodic"} == {(1,)}  # the dedicated server
    requests = [e for e in events if e["kind"] == "inference.request"]
    eval_requests = [e for e in requests if "eval_step" in e]
    assert {e["eval_step"] for e in eval_requests} == {0, 2, 4}
    # one set of weights per eval: every request of the eval at step s ran on step s's weights
    wrong = [
        (e["eval_step"], e["policy_version_start"], e["policy_version_end"])
        for e in eval_requests
        if not e["eval_step"] == e["policy_version_start"] == e["policy_version_end"]
    ]
    assert wrong == []
    assert {e["server"] for e in eval_requests if e["eval_phase"] == "periodic"} == {1}
    assert {e["server"] for e in requests if "group_id" in e} == {0}  # training never used the eval server


def check_wordle(reader: RunReader) -> None:
    rollouts = reader.rollouts()
    assert len(rollouts) == 3 * 4 * 4 and all(r["error"] is None for r in rollouts)
    multi = [r for r in rollouts if r["num_turns"] >= 2]
    assert len(multi) >= len(rollouts) // 2, [r["num_turns"] for r in rollouts]
    # what each turn's request carried, by (sample, draw, turn): (prompt tokens, completion tokens)
    sent: dict[tuple[str, int, int], list[tuple[int, int]]] = defaultdict(list)
    for e in reader.events():
        if e["kind"] == "inference.request" and "group_id" in e and not e.get("aborted"):
            sent[(e["sample_id"], e["rollout_index"], e["turn"])].append((e["prompt_tokens"], e["completion_tokens"]))
    first_prompt = multi[0]["turns"][0]["input_tokens"]
    for rollout in multi:
        turns: list[dict[str, Any]] = rollout["turns"]
        assert sum(t["input_tokens"] + t["output_tokens"] for t in turns) == rollout["total_tokens"]
        before = 0  # tokens of the trajectory before this turn: reused as they are
        for index, turn in enumerate(turns):
            expected = (before + turn["input_tokens"], turn["output_tokens"])
            assert expected in sent[(rollout["sample_id"], rollout["rollout_index"], index)], (rollout, index)
            if index:  # a later turn adds the feedback only, never the conversation again
                assert turn["input_tokens"] < first_prompt / 2
            before += turn["input_tokens"] + turn["output_tokens"]
        assert rollout["messages"][-1]["role"] == "assistant"
        assert sum(m["role"] == "user" for m in rollout["messages"]) == len(turns)  # the rules, then feedback
    assert {"solved", "guesses_used", "invalid_guesses"} <= set(rollouts[0]["sample_metrics"])


def check_i3_code(reader: RunReader) -> None:
    rollouts = reader.rollouts()
    assert len(rollouts) == 3 * 4 * 4
    graded = [r for r in rollouts if r["sample_metrics"]["has_code"]]
    assert graded, "the warm start should teach the ```python block format"
    assert all(
        r["sample_metrics"]["sandbox_commands"] >= 1 and not r["sample_metrics"]["sandbox_error"] for r in graded
    )
    events = reader.events()
    sandbox = [e for e in events if e["kind"].startswith("sandbox.")]
    kinds = {e["kind"] for e in sandbox}
    assert {"sandbox.create", "sandbox.execute", "sandbox.upload"} <= kinds, kinds
    assert {e["provider"] for e in sandbox} == {"local"}  # the run's sandbox_provider, through its context
    executed = [e for e in sandbox if e["kind"] == "sandbox.execute"]
    assert all(e["sample_id"] and "group_id" in e and e["command"] for e in executed)
    assert {e["sample_id"] for e in executed} <= {r["sample_id"] for r in rollouts} | {
        e["sample_id"] for e in events if e["kind"] == "orchestrator.group_dispatched"
    }


def check_deepdive(reader: RunReader) -> None:
    rollouts = reader.rollouts()
    assert len(rollouts) == 3 * 4 * 4 and {r["environment"] for r in rollouts} == {"deepdive"}
    assert all(r["error"] is None for r in rollouts), [r["error"] for r in rollouts if r["error"]]
    # the warm start taught the search_web call: the model searched, got results back and wrote again
    searched = [r for r in rollouts if r["sample_metrics"]["search_web_calls"] >= 1]
    assert searched, "no rollout called search_web"
    for rollout in searched:
        assert rollout["num_turns"] >= 2
        roles = [m["role"] for m in rollout["messages"]]
        assert roles.index("tool") > roles.index("assistant")  # the tool's result follows the call
    tool_events = [e for e in reader.events() if e["kind"] == "tool.call"]
    # the warm start played its demonstrations' searches too: recorded, marked, apart from the rollouts'
    assert any(e.get("warm_start") and e["ok"] for e in tool_events)
    calls = [e for e in tool_events if not e.get("warm_start")]
    searches = [e for e in calls if e["tool"] == "search_web"]
    assert any(e["ok"] for e in searches)
    # a search fails only where the model wrote its arguments wrong (refused, recorded), never in the backend
    assert all(e["ok"] or e["error"].startswith("bad arguments") for e in searches), searches
    # every call a rollout counts, run or refused, was recorded as it happened (groups still in flight when the
    # run ended have events but no rollout in the store)
    recorded = Counter((e["sample_id"], e["rollout_index"]) for e in calls if e["tool"] == "search_web")
    for rollout in rollouts:
        counted = rollout["sample_metrics"]["search_web_calls"]
        assert recorded[(rollout["sample_id"], rollout["rollout_index"])] >= counted
    assert {"judge_reward", "has_answer", "finished"} <= set(rollouts[0]["sample_metrics"])
