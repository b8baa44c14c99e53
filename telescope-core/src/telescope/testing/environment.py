"""Conformance kit for environments: inherit, give a factory, run pytest.

Usage, in an environment package's tests (about 30 lines with the examples)::

    from telescope.testing.environment import EnvironmentConformance

    class TestMyEnv(EnvironmentConformance):
        def environment_factory(self):
            return MyEnv(dataset_name="tests/data/my_env.jsonl")

        # optional: completions that must score above garbage
        def right_completion(self, sample):
            return f"<answer>{sample.answer}</answer>"

Every inherited ``test_*`` checks one part of the contract of
:mod:`telescope.api.environment`:

- the dataset loads, is non-empty, holds :class:`~telescope.api.records.Sample`
  records whose ``sample_id`` values are non-empty, unique and stable (a second
  instance gives the same ids in the same order);
- prompts render as chat messages (role and string content, ending with a user turn);
- ``metrics_ranges`` is well formed (``{"metric": {"min": a, "max": b}}``, a <= b);
- rewards are :class:`~telescope.api.records.RewardResult` with a finite float
  ``total_reward`` and finite float ``sample_metrics``, also for garbage completions
  (which must not raise), and inside the declared ``metrics_ranges``;
- scoring stores nothing on the environment (no per-rollout state on a shared
  object: attributes are neither added, rebound nor grown), and the environment
  can be pickled (it may be shipped to a worker process);
- multi-turn: a scripted rollout runs to the end within ``max_turns``, replies are
  messages, and two interleaved rollouts give the same rewards as run alone;
- tool environments: tool schemas are well formed, and ``get_tool_metrics`` reports
  the documented keys.

``right_completion`` (single-turn) or ``right_replies`` (multi-turn) let the kit
check that a right answer scores strictly more than garbage.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import pytest

from telescope.api.environment import BaseEnvironment, EnvironmentBase, MultiTurnEnvironment, RolloutState
from telescope.api.records import Message, RewardResult, Sample
from telescope.api.tools import ToolEnvironment

GARBAGE_COMPLETIONS: tuple[str, ...] = (
    "",
    "I don't know.",
    "<answer>((((</answer>",
    "\\boxed{",
    "<tool_call>{not json</tool_call>",
    '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
    "```python\nwhile True: pass\n```",
    "ünïcödé ✓ \x00 \ud7ff",
    "9" * 5000,
)

#: Keys a tool environment's ``get_tool_metrics`` reports (the documentation lists them).
TOOL_METRIC_KEYS: tuple[str, ...] = (
    "total_tool_calls",
    "tool_success_count",
    "tool_error_count",
    "tool_success_rate",
    "unique_tools_used",
)


def _snapshot(env: object) -> dict[str, tuple[int, int | None]]:
    """Identity and size of every attribute: a rebinding or a growing container shows."""
    out: dict[str, tuple[int, int | None]] = {}
    for key, value in vars(env).items():
        size = len(value) if isinstance(value, list | dict | set) else None
        out[key] = (id(value), size)
    return out


def check_reward(result: object, ranges: dict[str, dict[str, float]] | None = None) -> RewardResult:
    """Assert that ``result`` is a well-formed reward; return it."""
    assert isinstance(result, RewardResult), f"compute_reward returned {type(result).__name__}, not RewardResult"
    assert isinstance(result.total_reward, float), f"total_reward is {type(result.total_reward).__name__}"
    assert math.isfinite(result.total_reward), f"total_reward is {result.total_reward}"
    assert isinstance(result.sample_metrics, dict)
    for key, value in result.sample_metrics.items():
        assert isinstance(key, str)
        assert isinstance(value, float | int) and not isinstance(value, bool), f"metric {key!r} = {value!r}"
        assert math.isfinite(float(value)), f"metric {key!r} = {value}"
        if ranges and key in ranges:
            lo, hi = ranges[key]["min"], ranges[key]["max"]
            assert lo - 1e-9 <= value <= hi + 1e-9, f"metric {key!r} = {value} outside its declared [{lo}, {hi}]"
    return result


class EnvironmentConformance:
    """Base class of an environment's conformance tests (pytest collects the subclass)."""

    #: How many samples the per-sample checks use.
    samples_checked: ClassVar[int] = 4
    #: Completions (single-turn) or replies (multi-turn) that must not make scoring raise.
    garbage: ClassVar[tuple[str, ...]] = GARBAGE_COMPLETIONS

    def environment_factory(self) -> EnvironmentBase:
        raise NotImplementedError("a conformance test class must define environment_factory()")

    def right_completion(self, sample: Sample) -> str | None:
        """A single-turn completion that must score above every garbage completion."""
        return None

    def right_replies(self, sample: Sample) -> list[str] | None:
        """Multi-turn: the assistant replies of a rollout that must score above garbage."""
        return None

    # ----------------------------------------------------------------- fixtures
    @pytest.fixture
    def env(self) -> Iterator[EnvironmentBase]:
        environment = self.environment_factory()
        yield environment
        close = getattr(environment, "close", None)
        if callable(close):  # environments holding resources (sandbox pools) release them
            close()

    @pytest.fixture
    def samples(self, env: EnvironmentBase) -> Sequence[Sample]:
        return env.load_dataset()

    def _some(self, samples: Sequence[Sample]) -> list[Sample]:
        return list(samples[: self.samples_checked])

    # ------------------------------------------------------------- scoring help
    def play(self, env: MultiTurnEnvironment, sample: Sample, replies: Sequence[str]) -> tuple[RewardResult, int]:
        """Run one multi-turn rollout with scripted assistant replies; (reward, turns)."""
        state = env.initial_state(sample)
        messages = env.format_prompt(sample)
        for i in range(env.max_turns):
            reply = replies[min(i, len(replies) - 1)] if replies else ""
            messages.append({"role": "assistant", "content": reply})
            state.turn += 1
            if env.is_done(messages, state):
                break
            new = env.env_response(messages, state)
            assert isinstance(new, list) and all(isinstance(m, dict) and "role" in m for m in new)
            messages.extend(new)
        assert state.turn <= env.max_turns
        return check_reward(env.compute_reward(messages, sample, state), env.metrics_ranges), state.turn

    def score(self, env: EnvironmentBase, sample: Sample, text: str) -> RewardResult:
        if isinstance(env, BaseEnvironment):
            return check_reward(env.compute_reward(text, sample, ""), env.metrics_ranges)
        assert isinstance(env, MultiTurnEnvironment)
        return self.play(env, sample, [text])[0]

    # -------------------------------------------------------------------- tests
    def test_is_an_environment(self, env: EnvironmentBase) -> None:
        assert isinstance(env, EnvironmentBase)
        assert isinstance(env, BaseEnvironment) != isinstance(env, MultiTurnEnvironment)
        assert isinstance(type(env).name, str) and type(env).name, "set the class attribute `name`"

    def test_unknown_kwarg_raises(self, env: EnvironmentBase) -> None:
        with pytest.raises(TypeError):
            type(env)(no_such_option_for_conformance=1)  # type: ignore[call-arg]

    def test_dataset_loads(self, samples: Sequence[Sample]) -> None:
        assert len(samples) > 0
        assert all(isinstance(s, Sample) for s in samples)

    def test_sample_ids_unique_and_stable(self, samples: Sequence[Sample]) -> None:
        ids = [s.sample_id for s in samples]
        assert all(isinstance(i, str) and i for i in ids), "every sample needs a non-empty sample_id"
        assert len(set(ids)) == len(ids), "sample_id values must be unique"
        again = [s.sample_id for s in self.environment_factory().load_dataset()]
        assert again == ids, "a second instance must give the same sample ids in the same order"

    def test_prompts_render_as_messages(self, env: EnvironmentBase, samples: Sequence[Sample]) -> None:
        for sample in self._some(samples):
            messages = env.format_prompt(sample)
            assert isinstance(messages, list) and messages
            for m in messages:
                assert m.get("role") in {"system", "user", "assistant", "tool"}
                assert isinstance(m.get("content"), str)
            assert messages[-1]["role"] == "user"
            assert any(m["content"].strip() for m in messages)

    def test_metrics_ranges_well_formed(self, env: EnvironmentBase) -> None:
        for key, bounds in type(env).metrics_ranges.items():
            assert isinstance(key, str)
            assert set(bounds) == {"min", "max"}, f"metrics_ranges[{key!r}] needs exactly min and max"
            assert float(bounds["min"]) <= float(bounds["max"])

    def test_garbage_does_not_raise(self, env: EnvironmentBase, samples: Sequence[Sample]) -> None:
        for sample in self._some(samples)[:2]:
            for text in self.garbage:
                self.score(env, sample, text)

    def test_right_answer_beats_garbage(self, env: EnvironmentBase, samples: Sequence[Sample]) -> None:
        checked = 0
        for sample in self._some(samples):
            right: list[str] | None
            if isinstance(env, MultiTurnEnvironment):
                right = self.right_replies(sample)
            else:
                one = self.right_completion(sample)
                right = None if one is None else [one]
            if right is None:
                continue
            if isinstance(env, MultiTurnEnvironment):
                good = self.play(env, sample, right)[0].total_reward
            else:
                good = self.score(env, sample, right[0]).total_reward
            worst_garbage = max(self.score(env, sample, g).total_reward for g in self.garbage[:3])
            assert good > worst_garbage, f"right answer scored {good}, garbage {worst_garbage} ({sample.sample_id})"
            checked += 1
        if not checked:
            pytest.skip("define right_completion / right_replies to check that right answers score higher")

    def test_demonstrations_play(self, env: EnvironmentBase, samples: Sequence[Sample]) -> None:
        """The warm start's demonstrations (``demonstration``, ``demonstration_turns``) are replies it can score.

        They may teach the format only (a wrong guess, well formed): nothing is asked of their reward.
        """
        checked = 0
        for sample in self._some(samples):
            turns = env.demonstration_turns(sample) if isinstance(env, MultiTurnEnvironment) else None
            first = env.demonstration(sample)
            if turns is None and first is None:
                continue
            replies = turns if turns is not None else [first or ""]
            assert replies and all(isinstance(r, str) and r for r in replies), (
                f"an empty demonstration ({sample.sample_id})"
            )
            if isinstance(env, MultiTurnEnvironment):
                _, played = self.play(env, sample, replies)
                assert played >= 1
            else:
                self.score(env, sample, replies[0])
            checked += 1
        if not checked:
            pytest.skip("the environment has no demonstrations")

    def test_no_per_rollout_state_on_environment(self, env: EnvironmentBase, samples: Sequence[Sample]) -> None:
        sample = self._some(samples)[0]
        for text in self.garbage[:4]:  # a first pass may fill lazy caches (a client, a pool)
            self.score(env, sample, text)
        before = _snapshot(env)
        for text in self.garbage[:4]:
            self.score(env, sample, text)
        assert _snapshot(env) == before, "scoring changed the environment's attributes (per-rollout state?)"

    def test_picklable(self, env: EnvironmentBase, samples: Sequence[Sample]) -> None:
        self.score(env, self._some(samples)[0], self.garbage[1])
        clone = pickle.loads(pickle.dumps(env))
        assert type(clone) is type(env)

    # ------------------------------------------------------------- multi-turn
    def test_multi_turn_rollouts_are_independent(self, env: EnvironmentBase, samples: Sequence[Sample]) -> None:
        if not isinstance(env, MultiTurnEnvironment):
            pytest.skip("single-turn environment")
        picked = self._some(samples)
        a, b = picked[0], picked[-1]
        replies_a = self.right_replies(a) or list(self.garbage[1:3])
        replies_b = list(self.garbage[2:4])
        alone_a, _ = self.play(env, a, replies_a)
        alone_b, _ = self.play(env, b, replies_b)
        # Interleave the two rollouts turn by turn.
        runs: list[dict[str, Any]] = []
        for sample, replies in ((a, replies_a), (b, replies_b)):
            runs.append(
                {
                    "sample": sample,
                    "replies": replies,
                    "state": env.initial_state(sample),
                    "done": False,
                    "messages": env.format_prompt(sample),
                }
            )
        for i in range(env.max_turns):
            for run in runs:
                if run["done"]:
                    continue
                state: RolloutState = run["state"]
                messages: list[Message] = run["messages"]
                messages.append({"role": "assistant", "content": run["replies"][min(i, len(run["replies"]) - 1)]})
                state.turn += 1
                if env.is_done(messages, state):
                    run["done"] = True
                else:
                    messages.extend(env.env_response(messages, state))
        rewards = [env.compute_reward(r["messages"], r["sample"], r["state"]).total_reward for r in runs]
        assert rewards == [alone_a.total_reward, alone_b.total_reward]

    # ------------------------------------------------------------------- tools
    def test_tool_schemas_and_metrics(self, env: EnvironmentBase, samples: Sequence[Sample]) -> None:
        if not isinstance(env, ToolEnvironment):
            pytest.skip("not a tool environment")
        schemas = env.tool_schemas
        assert schemas, "a tool environment needs at least one tool"
        for schema in schemas:
            assert schema["type"] == "function"
            fn = schema["function"]
            assert isinstance(fn["name"], str) and fn["name"]
            assert fn["parameters"]["type"] == "object"
        state = env.initial_state(self._some(samples)[0])
        metrics = env.get_tool_metrics(state)
        for key in TOOL_METRIC_KEYS:
            assert key in metrics, f"get_tool_metrics lacks {key!r}"
        for schema in schemas:
            assert f"{schema['function']['name']}_calls" in metrics
