"""The loop's timeline events over fake services: groups, batches, steps, weight syncs, rewards, evals."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from telescope.api import events
from telescope.api.records import Rollout, Sample, Turn
from telescope.inference.generation import Generation, SamplingSettings
from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.rollouts import _score

from .fakes import FakeServices, ParityEnvironment
from .test_orchestrator import registry_with_parity, run_loop

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(PRESETS["test"])


@pytest.fixture
def captured() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    unsubscribe = events.subscribe(seen.append)
    yield seen
    unsubscribe()


class ContextRecordingServices(FakeServices):
    """Fake services that note the event context each request is made in (what the client's events get)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.contexts: list[dict[str, Any]] = []

    async def generate(
        self,
        server: int,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        seed: int,
        priority: int,
        sampling: SamplingSettings,
    ) -> Generation:
        self.contexts.append(events.current_context())
        return await super().generate(server, prompt_ids, max_tokens, seed=seed, priority=priority, sampling=sampling)


def test_the_loop_records_its_timeline(tmp_path: Path, tokenizer: Any, captured: list[dict[str, Any]]) -> None:
    services = ContextRecordingServices(vocab=[40])  # equal completions: some groups are dropped (zero advantage)
    evals = [{"name": "parity", "num_samples": 4}]
    run_loop(
        tmp_path,
        tokenizer,
        services,
        number_of_steps=3,
        evals=evals,
        eval_num_servers=0,
        eval_before_training=True,
        eval_after_training=True,
    )
    kinds = Counter(e["kind"] for e in captured)
    assert kinds["orchestrator.step"] == 3 and kinds["weights.sync"] == 4  # the initial push and one per step
    assert kinds["orchestrator.batch_assembled"] == 3 and kinds["eval.run"] == 2  # before and after training
    assert all(e.get("component") for e in captured)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for event in captured:
        by_kind.setdefault(event["kind"], []).append(event)

    steps = by_kind["orchestrator.step"]
    assert [e["step"] for e in steps] == [0, 1, 2] and all(e["duration_s"] > 0 for e in steps)
    assert [e["version"] for e in by_kind["weights.sync"]] == [0, 1, 2, 3]
    assert [e.get("step") for e in by_kind["weights.sync"]] == [None, 0, 1, 2]  # a step's sync carries the step

    dispatched = {e["group_id"]: e for e in by_kind["orchestrator.group_dispatched"]}
    completed = {e["group_id"]: e for e in by_kind["orchestrator.group_completed"]}
    discarded = by_kind["orchestrator.group_discarded"]
    assert {e["reason"] for e in discarded} == {"zero_advantage"}
    assert set(completed) | {e["group_id"] for e in discarded} <= set(dispatched)
    for group_id, event in completed.items():
        assert event["start"] == dispatched[group_id]["start"] and event["duration_s"] >= 0
        assert event["sample_id"] == dispatched[group_id]["sample_id"] and len(event["rewards"]) == 4
    trained = [g for e in by_kind["orchestrator.batch_assembled"] for g in e["group_ids"]]
    assert len(trained) == 3 * 3 and set(trained) <= set(completed)
    assert [e["samples"] for e in by_kind["orchestrator.batch_assembled"]] == [12, 12, 12]

    rewards = [e for e in by_kind["reward.compute"] if "eval" not in e]
    assert len(rewards) == 4 * (len(completed) + len(discarded))
    for reward in rewards:  # the ids of the rollout it scored
        assert reward["sample_id"] == dispatched[reward["group_id"]]["sample_id"]
        assert reward["environment"] == "parity" and reward["rollout_index"] in range(4) and reward["error"] is None
    eval_rewards = [e for e in by_kind["reward.compute"] if "eval" in e]
    assert len(eval_rewards) == 2 * 4 and {e["eval"] for e in eval_rewards} == {"parity"}
    assert {e["phase"] for e in by_kind["eval.run"]} == {"before", "after"}
    assert "eval/parity/reward_mean" in by_kind["eval.run"][0]["metrics"]

    training_requests = [c for c in services.contexts if "group_id" in c]
    assert training_requests and all({"sample_id", "rollout_index", "turn"} <= set(c) for c in training_requests)
    assert all("eval" in c and "turn" in c for c in services.contexts if "group_id" not in c)


def test_stale_groups_are_canceled_events(tmp_path: Path, tokenizer: Any, captured: list[dict[str, Any]]) -> None:
    """A group cancelled as stale is one ``orchestrator.group_canceled`` event."""
    from telescope.orchestrator.assembly import build_prompt_source, build_slots
    from telescope.orchestrator.scheduler import RolloutScheduler
    from telescope.orchestrator.settings import SchedulerSettings

    from .fakes import loop_config, plugins_for

    config = loop_config(
        tmp_path,
        advantage_norm="group",
        max_async_rollout=2,
        max_off_policy_steps=1,
        max_concurrent_prompts_per_server=32,
    )
    renderer = ChatRenderer(tokenizer)
    prompts = build_prompt_source(config, build_slots(config, plugins_for(registry_with_parity())), renderer)
    started: list[int] = []

    async def never_finishes(server: int, prompt_ids: list[int], max_tokens: int, seed: int, priority: int) -> Any:
        started.append(seed)
        await asyncio.Event().wait()

    async def scenario() -> None:
        scheduler = RolloutScheduler(
            SchedulerSettings.from_config(config, renderer.vocab_size), prompts, renderer, never_finishes, [0, 1]
        )
        scheduler.start()
        while len(started) < 3 * 3 * 4:  # steps 0..2, 3 groups of 4
            await asyncio.sleep(0.01)
        await scheduler.set_policy_version(2)  # dispatched at 0 < 2 - 1: stale
        while scheduler.stats.canceled_rollouts < 36:
            await asyncio.sleep(0.01)
        await scheduler.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        prompts.close()
    canceled = [e for e in captured if e["kind"] == "orchestrator.group_canceled"]
    stale = [e for e in canceled if e["dispatch_version"] == 0]  # closing cancels the groups dispatched since too
    assert len(stale) == 9 and all(e["rollouts"] == 4 and e["duration_s"] > 0 for e in stale)


def test_a_failing_reward_is_an_event_with_its_error(captured: list[dict[str, Any]], tokenizer: Any) -> None:
    environment = ParityEnvironment(fail_on="q9")
    sample = Sample(prompt="question 9", sample_id="q9", environment="parity")
    rollout = Rollout(sample=sample, turns=[Turn([1], [40, 41], [-1.0, -1.0], 0, "stop", "ab")])
    result = asyncio.run(_score(environment, rollout, ChatRenderer(tokenizer), None))
    [event] = [e for e in captured if e["kind"] == "reward.compute"]
    assert result.error and "exploded" in event["error"] and event["reward"] == 0.0
    assert (event["sample_id"], event["environment"]) == ("q9", "parity") and event["duration_s"] >= 0
