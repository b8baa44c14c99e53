"""Conformance kit for agent environments: inherit, give a factory, run pytest.

Usage, in an agent environment package's tests::

    from telescope.testing.agent import AgentEnvironmentConformance

    class TestMyAgent(AgentEnvironmentConformance):
        def environment_factory(self):
            return MyAgent(num_samples=20)

The kit runs the environment's program for real: through a gateway served in the test's
event loop (:class:`~telescope.orchestrator.agent_gateway.AgentGateway`), with the
client a run gives it, against a *scripted policy* (:class:`ScriptedPolicy`: chosen
replies, tokenized by Telescope's tiny local tokenizer, whose chat template renders tools
and parses ``<tool_call>`` markup as Qwen's does). Every inherited ``test_*`` checks one
part of the contract of :mod:`telescope.api.agent`:

- the dataset loads, is non-empty, and its ``sample_id`` values are unique and stable;
- ``run`` is a coroutine function, and the environment pickles (it may be shipped to a
  worker process) and keeps no per-episode state on itself across episodes;
- garbage replies (empty text, refusals, broken tool calls, an unknown tool) never make
  the program raise: the episode is scored, with a finite reward, and its calls recorded;
- ``demonstration_replies`` (when given) solve the sample: they score strictly more
  than garbage, and the warm start records one example per call;
- episodes of different samples run concurrently give the rewards they give alone.

``garbage_replies`` lists the garbage tried; override it to add your own.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import pickle
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import pytest

from telescope.api.agent import AgentEnvironment
from telescope.api.records import Rollout, Sample, SupervisedExample
from telescope.inference.generation import Generation
from telescope.orchestrator.rollouts import RolloutLimits

GARBAGE_REPLIES: tuple[str, ...] = (
    "",
    "I don't know.",
    "<tool_call>{not json</tool_call>",
    '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
    "ünïcödé ✓",
)


class ScriptedPolicy:
    """A ``generate`` answering call ``i`` with ``replies[i]`` (the last one for later calls).

    Each reply is text (or a function of the prompt's text) tokenized with ``tokenizer`` and
    followed by its end-of-turn token, as a model that stops; every token is reported at
    ``version`` with log-probability -0.5. The prompts it was given are kept in ``prompts``.
    """

    def __init__(self, tokenizer: Any, replies: Sequence[str | Callable[[str], str]], version: int = 0) -> None:
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.version = version
        self.prompts: list[list[int]] = []
        self.delay_s = 0.0

    async def __call__(self, prompt_ids: list[int], max_tokens: int, call: int) -> Generation:
        self.prompts.append(list(prompt_ids))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        reply = self.replies[min(call, len(self.replies) - 1)]
        text = reply(self.tokenizer.decode(prompt_ids)) if callable(reply) else reply
        ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id][:max_tokens]
        return Generation(ids, [-0.5] * len(ids), "stop", self.version, self.version, [self.version] * len(ids))


def tiny_tokenizer() -> Any:
    """Telescope's tiny local tokenizer (built offline), with its tool-aware chat template."""
    from telescope.models.tiny import PRESETS, build_tokenizer

    return build_tokenizer(PRESETS["test"])


async def run_episodes(
    tokenizer: Any,
    environment: AgentEnvironment,
    episodes: Sequence[tuple[Sample, ScriptedPolicy]],
    *,
    max_tokens: int = 128,
    max_model_len: int = 2048,
    chat_template: str | None = None,
) -> list[Rollout]:
    """Run ``environment``'s program on each (sample, policy) concurrently through a gateway of their own."""
    from telescope.orchestrator.agent_gateway import AgentGateway, run_agent_episode

    gateway = AgentGateway(tokenizer, chat_template=chat_template, max_model_len=max_model_len, model_name="policy")
    await gateway.start()
    try:
        return list(
            await asyncio.gather(
                *(
                    run_agent_episode(
                        environment,
                        sample,
                        gateway=gateway,
                        generate=policy,
                        policy_version=lambda policy=policy: policy.version,  # type: ignore[misc]
                        limits=RolloutLimits(max_tokens, max_model_len),
                    )
                    for sample, policy in episodes
                )
            )
        )
    finally:
        await gateway.close()


async def record_demonstrations(
    tokenizer: Any, environment: AgentEnvironment, sample: Sample, replies: list[str], max_model_len: int = 2048
) -> list[SupervisedExample]:
    """The warm-start examples the run would record for ``sample``."""
    from telescope.orchestrator.agent_gateway import AgentGateway, record_demonstration

    gateway = AgentGateway(tokenizer, chat_template=None, max_model_len=max_model_len, model_name="policy")
    await gateway.start()
    try:
        return await record_demonstration(environment, sample, replies, gateway=gateway, max_model_len=max_model_len)
    finally:
        await gateway.close()


class AgentEnvironmentConformance:
    """Inherit and implement :meth:`environment_factory` (see the module docstring)."""

    garbage_replies: ClassVar[tuple[str, ...]] = GARBAGE_REPLIES
    #: samples the kit runs (the first ones of the dataset)
    samples_tried: ClassVar[int] = 3

    def environment_factory(self) -> AgentEnvironment:
        raise NotImplementedError("return an instance of the agent environment under test")

    @pytest.fixture
    def environment(self) -> AgentEnvironment:
        environment = self.environment_factory()
        assert isinstance(environment, AgentEnvironment), f"{type(environment).__name__} is not an AgentEnvironment"
        return environment

    @pytest.fixture(scope="class")
    @classmethod
    def tokenizer(cls) -> Any:
        return tiny_tokenizer()

    def _samples(self, environment: AgentEnvironment) -> list[Sample]:
        return list(environment.load_dataset())[: self.samples_tried]

    def test_dataset_loads_with_unique_stable_ids(self, environment: AgentEnvironment) -> None:
        samples = list(environment.load_dataset())
        assert samples, "load_dataset() returned no samples"
        ids = [s.sample_id for s in samples]
        assert all(ids) and len(set(ids)) == len(ids), "sample_id values must be non-empty and unique"
        assert [s.sample_id for s in self.environment_factory().load_dataset()] == ids, "sample ids are not stable"

    def test_run_is_a_coroutine_function_and_the_environment_pickles(self, environment: AgentEnvironment) -> None:
        assert inspect.iscoroutinefunction(type(environment).run), "run(client, sample) must be async def"
        assert isinstance(pickle.loads(pickle.dumps(environment)), type(environment))

    def test_garbage_is_scored_never_raised(self, environment: AgentEnvironment, tokenizer: Any) -> None:
        sample = self._samples(environment)[0]
        before = dict(vars(environment))
        for garbage in self.garbage_replies:
            (rollout,) = asyncio.run(
                run_episodes(tokenizer, environment, [(sample, ScriptedPolicy(tokenizer, [garbage]))])
            )
            assert rollout.error is None, f"reply {garbage!r}: the program failed: {rollout.error}"
            assert rollout.agent_calls, f"reply {garbage!r}: the program never called the model"
            assert rollout.reward is not None and math.isfinite(rollout.reward.total_reward)
        assert dict(vars(environment)) == before, "the environment kept per-episode state on itself"

    def test_demonstrations_score_above_garbage_and_record_every_call(
        self, environment: AgentEnvironment, tokenizer: Any
    ) -> None:
        sample = self._samples(environment)[0]
        replies = environment.demonstration_replies(sample)
        if replies is None:
            pytest.skip("the environment gives no demonstration_replies")
        episodes = [(sample, ScriptedPolicy(tokenizer, replies)), (sample, ScriptedPolicy(tokenizer, [""]))]
        good, garbage = asyncio.run(run_episodes(tokenizer, environment, episodes))
        assert good.error is None, good.error
        assert good.reward is not None and garbage.reward is not None
        assert good.reward.total_reward > garbage.reward.total_reward, "the demonstration does not beat garbage"
        examples = asyncio.run(record_demonstrations(tokenizer, environment, sample, replies))
        assert len(examples) == len(good.agent_calls) and all(e.completion_ids for e in examples)

    def test_concurrent_episodes_give_the_rewards_they_give_alone(
        self, environment: AgentEnvironment, tokenizer: Any
    ) -> None:
        samples = self._samples(environment)

        def policy(sample: Sample) -> ScriptedPolicy:
            return ScriptedPolicy(tokenizer, environment.demonstration_replies(sample) or ["I don't know."])

        alone = [asyncio.run(run_episodes(tokenizer, environment, [(s, policy(s))]))[0] for s in samples]
        together = asyncio.run(run_episodes(tokenizer, environment, [(s, policy(s)) for s in samples]))
        rewards = [[r.reward.total_reward if r.reward else None for r in rs] for rs in (alone, together)]
        assert rewards[0] == rewards[1]
