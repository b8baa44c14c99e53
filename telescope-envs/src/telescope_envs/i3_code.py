"""i3_code: write a Python program; the reward is the share of its tests that pass in a sandbox.

The INTELLECT-3 code set (``PrimeIntellect/INTELLECT-3-RL``, subset ``code``):
each sample is a programming problem with test cases. The model answers with a
```` ```python ```` block; the last one is the solution. Scoring leases a clean
sandbox from a :class:`telescope_sandbox.SandboxPool`, uploads the solution, the
tests and a runner (:mod:`telescope_envs.code_harness`), runs them with
``timeout_per_test`` each and reads back one result per test.

The provider is the run's ``sandbox_provider`` (the config field, ``"local"`` by
default, which reaches the environment through its run context); the
``sandbox_provider`` keyword argument overrides it for this environment. Validation
checks that the chosen provider is installed (``uses_sandbox``) and that
telescope-sandbox is (``requires``).

Reward: the pass rate (``reward_mode="pass_rate"``, default) or 1.0 only when all
pass (``"all_or_nothing"``). Sample metrics: ``pass_rate``, ``all_passed``,
``tests_total``, ``tests_passed``, ``tests_timed_out``, ``tests_errored``,
``has_code``, ``test_time_s``, ``max_test_time_s``, ``sandbox_error`` and the
sandbox usage counters (``sandbox_commands``, ``sandbox_command_errors``,
``sandbox_timeouts``, ``sandbox_errors``, ``sandbox_command_time_s``,
``sandbox_cpu_time_s``). A sandbox failure (not a failing program) sets
``RewardResult.error``, so the sample is counted as errored, not as wrong.

A row's ``solution`` column (a reference program), when present, is the
demonstration of the optional warm start (as a ```` ```python ```` block).

Tests are read from the row's ``verification_info`` / ``info`` (a dict or a JSON
string) or ``tests`` / ``test_cases`` column, as ``{"inputs": [...], "outputs":
[...], "fn_name": ...}`` or ``[{"input": ..., "output": ...}]``.

Needs ``telescope-sandbox`` (``pip install 'telescope-envs[code]'``), imported when
the first completion is scored. The pool is created lazily (or before the first
rollout with ``eager_prepare_resources``: :meth:`I3CodeEnvironment.prepare_resources`)
and is not pickled.
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any, ClassVar

from telescope.api.environment import BaseEnvironment
from telescope.api.records import RewardResult, Sample
from telescope_envs._data import load_rows, stable_id, unique_ids
from telescope_envs._deps import require
from telescope_envs._prompts import ThinkingPrefix
from telescope_envs.code_harness import HARNESS

I3_DATASET = "PrimeIntellect/INTELLECT-3-RL"
_CODE_RE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
INSTRUCTION = (
    "Write a complete Python 3 solution. Unless a function name is given, read from standard input and "
    "write to standard output. Put the final code in a single ```python code block."
)


def extract_code(completion: str) -> str | None:
    """The last fenced code block (python or unlabelled), or None."""
    blocks = _CODE_RE.findall(completion)
    return blocks[-1] if blocks else None


def _as_dict(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return None
    return value


def parse_tests(row: dict[str, Any]) -> tuple[list[dict[str, str]], str | None]:
    """The row's tests as ``[{"input", "output"}]`` strings, and the function name if call-based."""
    spec: Any = None
    for key in ("verification_info", "info", "tests", "test_cases"):
        if row.get(key) is not None:
            spec = _as_dict(row[key])
            if isinstance(spec, dict) and "verification_info" in spec:
                spec = _as_dict(spec["verification_info"])
            if isinstance(spec, dict) and "test_cases" in spec:
                spec = {**spec, **(_as_dict(spec["test_cases"]) or {})}
            break
    fn_name = None
    tests: list[dict[str, str]] = []

    def text(v: Any) -> str:
        return v if isinstance(v, str) else json.dumps(v)

    if isinstance(spec, dict):
        fn_name = spec.get("fn_name") or None
        for i, o in zip(spec.get("inputs", []), spec.get("outputs", []), strict=False):
            tests.append({"input": text(i), "output": text(o)})
    elif isinstance(spec, list):
        tests = [{"input": text(t["input"]), "output": text(t["output"])} for t in spec if isinstance(t, dict)]
    return tests, fn_name


class I3CodeEnvironment(ThinkingPrefix, BaseEnvironment):
    """Code generation graded by running tests in a sandbox."""

    name: ClassVar[str] = "i3_code"
    data_files: ClassVar[dict[str, tuple[str, ...]]] = {"dataset_name": ()}  # column names vary by source
    metrics_ranges: ClassVar[dict[str, dict[str, float]]] = {
        "pass_rate": {"min": 0.0, "max": 1.0},
        "all_passed": {"min": 0.0, "max": 1.0},
        "has_code": {"min": 0.0, "max": 1.0},
        "sandbox_error": {"min": 0.0, "max": 1.0},
    }
    reward_min: ClassVar[float] = 0.0
    reward_max: ClassVar[float] = 1.0
    uses_sandbox: ClassVar[bool] = True
    requires: ClassVar[dict[str, str]] = {"telescope_sandbox": "pip install 'telescope-envs[code]'"}

    def __init__(
        self,
        dataset_name: str = I3_DATASET,
        dataset_subset: str | None = "code",
        dataset_split: str = "train",
        max_samples: int | None = None,
        max_num_tests: int = 15,
        timeout_per_test: float = 10.0,
        reward_mode: str = "pass_rate",
        sandbox_provider: str | None = None,
        sandbox_pool_size: int = 2,
        sandbox_max_concurrency: int | None = None,
        sandbox_memory_mb: int = 1024,
        sandbox_disk_mb: int = 256,
        sandbox_provider_kwargs: dict[str, Any] | None = None,
        add_thinking_prefix: bool = False,
        instruction: str = INSTRUCTION,
        provider: str | None = None,
        pool_size: int | None = None,
        memory_mb: int | None = None,
        disk_size_gb: float | None = None,
    ) -> None:
        """``provider``, ``pool_size``, ``memory_mb`` and ``disk_size_gb`` are the upstream's names of
        ``sandbox_provider``, ``sandbox_pool_size``, ``sandbox_memory_mb`` and ``sandbox_disk_mb`` (in GB);
        an upstream name that is set wins. ``instruction`` follows each question in the prompt (default: the
        answer format, a python block reading stdin); ``""`` leaves the question alone, for data whose
        questions already say how to answer or a model taught the format by the warm start."""
        sandbox_provider = provider if provider is not None else sandbox_provider
        sandbox_pool_size = pool_size if pool_size is not None else sandbox_pool_size
        sandbox_memory_mb = memory_mb if memory_mb is not None else sandbox_memory_mb
        sandbox_disk_mb = round(disk_size_gb * 1024) if disk_size_gb is not None else sandbox_disk_mb
        if reward_mode not in ("pass_rate", "all_or_nothing"):
            raise ValueError(f"i3_code reward_mode must be 'pass_rate' or 'all_or_nothing', not {reward_mode!r}")
        self.dataset_name = dataset_name
        self.dataset_subset = dataset_subset
        self.dataset_split = dataset_split
        self.max_samples = max_samples
        self.max_num_tests = max_num_tests
        self.timeout_per_test = timeout_per_test
        self.reward_mode = reward_mode
        self.sandbox_provider = sandbox_provider
        self.sandbox_pool_size = sandbox_pool_size
        self.sandbox_max_concurrency = sandbox_max_concurrency
        self.sandbox_memory_mb = sandbox_memory_mb
        self.sandbox_disk_mb = sandbox_disk_mb
        self.sandbox_provider_kwargs = dict(sandbox_provider_kwargs or {})
        self.add_thinking_prefix = add_thinking_prefix
        self.instruction = instruction
        self._pool: Any = None
        self._pool_lock = threading.Lock()

    # ------------------------------------------------------------------ data
    def load_dataset(self) -> list[Sample]:
        local = self.dataset_name.endswith((".json", ".jsonl", ".csv", ".parquet"))
        rows = load_rows(self.dataset_name, self.dataset_split, None if local else self.dataset_subset)
        items: list[tuple[str, list[dict[str, str]], str | None, str | None]] = []
        for row in rows:
            question = row.get("question") or row.get("prompt") or row.get("problem")
            tests, fn_name = parse_tests(row)
            solution = row.get("solution")
            if question and tests:
                items.append((str(question), tests[: self.max_num_tests], fn_name, str(solution) if solution else None))
        if self.max_samples is not None:
            items = items[: self.max_samples]
        ids = unique_ids([stable_id(self.name, q) for q, _, _, _ in items])
        samples = []
        for sid, (question, tests, fn_name, solution) in zip(ids, items, strict=True):
            hint = f"\n\nImplement the function `{fn_name}`." if fn_name else ""
            answer: dict[str, Any] = {"tests": tests, "fn_name": fn_name}
            if solution is not None:
                answer["solution"] = solution
            samples.append(
                Sample(
                    prompt=f"{question}{hint}\n\n{self.instruction}" if self.instruction else f"{question}{hint}",
                    answer=answer,
                    sample_id=sid,
                    environment=self.name,
                )
            )
        return samples

    def demonstration(self, sample: Sample) -> str | None:
        """The row's reference solution as a python block (None when the dataset has none)."""
        solution = sample.answer.get("solution")
        return f"```python\n{solution.strip()}\n```" if solution else None

    # ------------------------------------------------------------- sandboxes
    @property
    def provider_name(self) -> str:
        """The sandbox provider used: the ``sandbox_provider`` keyword, else the run's (its context)."""
        return self.sandbox_provider or self.context.sandbox_provider

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pool"] = None
        state["_pool_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pool_lock = threading.Lock()

    def pool(self) -> Any:
        """The sandbox pool, created on first use (shared infrastructure, not rollout state)."""
        with self._pool_lock:
            if self._pool is None:
                sandbox = require("telescope_sandbox", "code", self.name)
                from telescope.api.sandbox import SandboxLimits

                n_tests = self.max_num_tests
                limits = SandboxLimits(
                    cpu=1,
                    memory_mb=self.sandbox_memory_mb,
                    disk_mb=self.sandbox_disk_mb,
                    timeout_s=self.timeout_per_test * n_tests + 30,
                    max_processes=64,
                )
                self._pool = sandbox.SandboxPool(
                    self.provider_name,
                    size=self.sandbox_pool_size,
                    max_concurrency=self.sandbox_max_concurrency,
                    limits=limits,
                    provider_kwargs=self.sandbox_provider_kwargs,
                )
            return self._pool

    def prepare_resources(self) -> None:
        """Create the sandbox pool now, with its ``sandbox_pool_size`` sandboxes warm (``eager_prepare_resources``)."""
        self.pool()

    def close(self) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None

    # ---------------------------------------------------------------- reward
    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        t0 = time.perf_counter()
        tests: list[dict[str, str]] = sample.answer["tests"]
        metrics: dict[str, float] = {
            "pass_rate": 0.0,
            "all_passed": 0.0,
            "tests_total": float(len(tests)),
            "tests_passed": 0.0,
            "tests_timed_out": 0.0,
            "tests_errored": 0.0,
            "has_code": 0.0,
            "test_time_s": 0.0,
            "max_test_time_s": 0.0,
            "sandbox_error": 0.0,
        }
        code = extract_code(completion)
        error: str | None = None
        if code is not None:
            metrics["has_code"] = 1.0
            usage = require("telescope_sandbox", "code", self.name).SandboxUsage()
            try:
                results = self._run_tests(code, sample, usage)
            except Exception as exc:  # infrastructure failure: the sample is errored, the run goes on
                metrics["sandbox_error"] = 1.0
                usage.record_error()
                error = f"sandbox failure: {type(exc).__name__}: {exc}"
                results = []
            passed = sum(1 for r in results if r.get("passed") is True)
            times = [float(r.get("time_s", 0.0)) for r in results]
            metrics["tests_passed"] = float(passed)
            metrics["tests_timed_out"] = float(sum(1 for r in results if r.get("status") == "timeout"))
            metrics["tests_errored"] = float(sum(1 for r in results if r.get("status") == "error"))
            metrics["pass_rate"] = passed / len(tests) if tests else 0.0
            metrics["all_passed"] = float(bool(tests) and passed == len(tests))
            metrics["test_time_s"] = sum(times)
            metrics["max_test_time_s"] = max(times, default=0.0)
            metrics.update(usage.as_metrics())
        metrics["reward_compute_time"] = time.perf_counter() - t0
        reward = metrics["pass_rate"] if self.reward_mode == "pass_rate" else metrics["all_passed"]
        return RewardResult(total_reward=float(reward), sample_metrics=metrics, error=error)

    def _run_tests(self, code: str, sample: Sample, usage: Any) -> list[dict[str, Any]]:
        tests = sample.answer["tests"]
        spec = {"tests": tests, "fn_name": sample.answer.get("fn_name"), "timeout": self.timeout_per_test}
        with self.pool().acquire(usage) as sandbox:
            sandbox.upload("solution.py", code.encode())
            sandbox.upload("tests.json", json.dumps(spec).encode())
            sandbox.upload("run_tests.py", HARNESS.encode())
            budget = self.timeout_per_test * len(tests) + 30
            result = sandbox.execute(["python3", "run_tests.py"], timeout_s=budget)
        out: list[dict[str, Any]] = []
        for line in result.stdout.splitlines():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue  # the solution's own prints never reach here (they go to the test's pipe)
            if isinstance(item, dict) and "passed" in item:
                out.append(item)
        if not result.ok and not out:
            raise RuntimeError(f"the test runner failed (exit {result.exit_code}): {result.stderr[-300:]}")
        return out
