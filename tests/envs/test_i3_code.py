"""i3_code: test parsing, grading in a local sandbox, sandbox metrics, conformance.

Grading needs telescope-sandbox (the ``code`` extra); those tests skip without it
(``nox -s "tests(package='envs')"`` installs core and envs only).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from telescope.api import events
from telescope.api.context import EnvironmentContext
from telescope.api.environment import bind_context
from telescope.api.records import Sample
from telescope.testing.environment import EnvironmentConformance
from telescope_envs.i3_code import INSTRUCTION, I3CodeEnvironment, extract_code, parse_tests

DATA = Path(__file__).parent / "data"
NEEDS_SANDBOX = pytest.mark.requires_dist("telescope-sandbox")
SUM_RIGHT = "Here you go:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"
SUM_WRONG = "```python\na, b = map(int, input().split())\nprint(a - b)\n```"


def make_env() -> I3CodeEnvironment:
    return I3CodeEnvironment(dataset_name=str(DATA / "i3_code.jsonl"), timeout_per_test=5, sandbox_pool_size=1)


@pytest.fixture
def env() -> Iterator[I3CodeEnvironment]:
    environment = make_env()
    yield environment
    environment.close()


@NEEDS_SANDBOX
class TestI3CodeConformance(EnvironmentConformance):
    samples_checked = 2
    garbage = ("", "no code here", "```python\nimport sys; sys.exit(3)\n```", "```python\nprint(\n```")

    def environment_factory(self) -> I3CodeEnvironment:
        return make_env()

    def right_completion(self, sample: Sample) -> str | None:
        solutions = {
            "sum": "```python\na, b = map(int, input().split())\nprint(a + b)\n```",
            "squared": "```python\nn = int(input())\nprint(n * n)\n```",
        }
        text = str(sample.prompt)
        return solutions["sum"] if "sum" in text else solutions["squared"]


def test_parse_tests_formats() -> None:
    samples = make_env().load_dataset()
    assert len(samples) == 3
    assert samples[0].answer["tests"][1] == {"input": "10 -3\n", "output": "7\n"}
    assert samples[0].answer["fn_name"] is None
    assert samples[2].answer["fn_name"] == "add_one"
    assert parse_tests({"tests": [{"input": "1", "output": "2"}]}) == ([{"input": "1", "output": "2"}], None)
    assert extract_code("```py\nx=1\n```\n```python\nx=2\n```") == "x=2\n"


@NEEDS_SANDBOX
def test_right_and_wrong_solutions(env: I3CodeEnvironment) -> None:
    sample = env.load_dataset()[0]
    right = env.compute_reward(SUM_RIGHT, sample)
    assert right.total_reward == 1.0 and right.error is None
    assert right.sample_metrics["tests_passed"] == 3 and right.sample_metrics["all_passed"] == 1.0
    wrong = env.compute_reward(SUM_WRONG, sample)
    # 0 - 0 = 0 passes by accident: 1 of 3
    assert wrong.total_reward == pytest.approx(1 / 3)
    assert wrong.sample_metrics["all_passed"] == 0.0


@NEEDS_SANDBOX
def test_call_based_solution(env: I3CodeEnvironment) -> None:
    sample = env.load_dataset()[2]
    good = env.compute_reward("```python\ndef add_one(x):\n    return x + 1\n```", sample)
    assert good.total_reward == 1.0
    cls = env.compute_reward("```python\nclass Solution:\n    def add_one(self, x):\n        return x + 2\n```", sample)
    assert cls.total_reward == 0.0 and cls.sample_metrics["tests_passed"] == 0


@pytest.mark.slow
@NEEDS_SANDBOX
def test_timeouts_and_crashes_are_counted_not_raised() -> None:
    env = I3CodeEnvironment(dataset_name=str(DATA / "i3_code.jsonl"), timeout_per_test=1, sandbox_pool_size=1)
    try:
        sample = env.load_dataset()[1]  # two tests
        looping = env.compute_reward("```python\nwhile True:\n    pass\n```", sample)
        assert looping.total_reward == 0.0 and looping.error is None
        assert looping.sample_metrics["tests_timed_out"] == 2
        crash = env.compute_reward("```python\nraise SystemExit(4)\n```", sample)
        assert crash.sample_metrics["tests_errored"] == 2 and crash.total_reward == 0.0
    finally:
        env.close()


@NEEDS_SANDBOX
def test_sandbox_metrics_and_events(env: I3CodeEnvironment) -> None:
    sample = env.load_dataset()[0]
    seen: list[dict[str, Any]] = []
    unsubscribe = events.subscribe(seen.append)
    try:
        result = env.compute_reward(SUM_RIGHT, sample)
    finally:
        unsubscribe()
    m = result.sample_metrics
    assert m["sandbox_commands"] == 1 and m["sandbox_errors"] == 0 and m["sandbox_error"] == 0
    assert m["sandbox_command_time_s"] > 0 and m["test_time_s"] > 0 and m["max_test_time_s"] <= m["test_time_s"]
    kinds = [e["kind"] for e in seen]
    assert "sandbox.execute" in kinds and kinds.count("sandbox.upload") == 3
    execute = next(e for e in seen if e["kind"] == "sandbox.execute")
    assert execute["exit_code"] == 0 and execute["duration_s"] > 0 and "run_tests.py" in str(execute["command"])


def test_no_code_block_scores_zero_without_sandbox(env: I3CodeEnvironment) -> None:
    result = env.compute_reward("print(1)", env.load_dataset()[0])
    assert result.total_reward == 0.0 and result.sample_metrics["has_code"] == 0.0
    assert env._pool is None  # nothing was run


@NEEDS_SANDBOX
def test_broken_sandbox_provider_marks_sample_errored() -> None:
    env = I3CodeEnvironment(dataset_name=str(DATA / "i3_code.jsonl"), sandbox_provider="no_such_provider")
    result = env.compute_reward(SUM_RIGHT, env.load_dataset()[0])
    assert result.error is not None and "no_such_provider" in result.error
    assert result.sample_metrics["sandbox_error"] == 1.0 and result.total_reward == 0.0


@NEEDS_SANDBOX
def test_the_run_context_chooses_the_provider_unless_the_environment_overrides_it() -> None:
    """The run's ``sandbox_provider`` reaches i3_code through its context; its own keyword wins (issue 15)."""
    env = make_env()
    assert env.provider_name == "local"  # outside a run: the context's default
    bind_context(env, EnvironmentContext(sandbox_provider="provider_of_the_run"))
    assert env.provider_name == "provider_of_the_run"
    result = env.compute_reward(SUM_RIGHT, env.load_dataset()[0])  # the pool is made with the run's provider
    assert result.error is not None and "provider_of_the_run" in result.error
    env.close()
    own = I3CodeEnvironment(dataset_name=str(DATA / "i3_code.jsonl"), timeout_per_test=5, sandbox_provider="local")
    bind_context(own, EnvironmentContext(sandbox_provider="provider_of_the_run"))
    try:
        assert own.provider_name == "local" and own.compute_reward(SUM_RIGHT, own.load_dataset()[0]).total_reward == 1.0
    finally:
        own.close()


def test_a_reference_solution_is_the_warm_start_demonstration(tmp_path: Path) -> None:
    data = tmp_path / "code.jsonl"
    data.write_text(
        '{"question": "Print n + 1.", "tests": [{"input": "1", "output": "2"}],'
        ' "solution": "print(int(input()) + 1)"}\n'
        '{"question": "Print n.", "tests": [{"input": "1", "output": "1"}]}\n',
        encoding="utf-8",
    )
    env = I3CodeEnvironment(dataset_name=str(data))
    with_solution, without = env.load_dataset()
    demonstration = env.demonstration(with_solution)
    assert demonstration == "```python\nprint(int(input()) + 1)\n```" and extract_code(demonstration) is not None
    assert env.demonstration(without) is None


def test_the_instruction_follows_each_question_unless_it_is_empty() -> None:
    data = str(DATA / "i3_code.jsonl")
    default = I3CodeEnvironment(dataset_name=data).load_dataset()
    own = I3CodeEnvironment(dataset_name=data, instruction="Answer in Python.").load_dataset()
    bare = I3CodeEnvironment(dataset_name=data, instruction="").load_dataset()
    for d, o, b in zip(default, own, bare, strict=True):
        assert d.prompt == f"{b.prompt}\n\n{INSTRUCTION}" and o.prompt == f"{b.prompt}\n\nAnswer in Python."
        assert not str(b.prompt).endswith("\n") and d.sample_id == o.sample_id == b.sample_id


def test_without_telescope_sandbox_a_config_using_i3_code_is_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The missing package is a validate-time error naming the extra, not a failure of every reward (issue 15)."""
    from telescope.config import ConfigError, load_config, rules

    installed = rules.module_installed
    monkeypatch.setattr(rules, "module_installed", lambda module: module != "telescope_sandbox" and installed(module))
    with pytest.raises(ConfigError) as info:
        load_config(
            None, ["--environments", f"[{{name: i3_code, kwargs: {{dataset_name: {DATA / 'i3_code.jsonl'}}}}}]"]
        )
    message = str(info.value)
    assert "environments[0]: environment 'i3_code' needs the 'telescope_sandbox' package" in message
    assert "pip install 'telescope-envs[code]'" in message
