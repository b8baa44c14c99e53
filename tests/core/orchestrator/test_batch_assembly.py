"""Batch assembly: ``first_finished`` takes the first groups to finish; ``deterministic`` waits for its own.

The scheduler is driven the way the Orchestrator drives it (next batch, then the
new policy version) over a fake generation service whose completion times are
long-tailed (Pareto, seeded by each request's seed) and whose stragglers can be
made to hang until released, so every assertion is about what happened, not how
fast.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from telescope.api import events
from telescope.inference.generation import Generation, ServerUnavailable
from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.assembly import build_prompt_source, build_slots
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.group_records import ScheduledGroup
from telescope.orchestrator.scheduler import ReadyGroup, RolloutScheduler
from telescope.orchestrator.settings import SchedulerSettings
from telescope.plugins.registry import PluginKind, Registrar, Registry
from telescope.schema.config import TelescopeConfig

from .fakes import ParityEnvironment, loop_config, plugins_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    return ChatRenderer(build_tokenizer(PRESETS["test"]))


class LongTailed:
    """Generation with Pareto-distributed delays; a request whose seed draws below ``hang`` waits for ``release``."""

    def __init__(self, scale_s: float = 0.002, cap_s: float = 0.3, hang: float = 0.0) -> None:
        self.scale_s, self.cap_s, self.hang = scale_s, cap_s, hang
        self.version = 0
        self.release = asyncio.Event()
        self.cancelled: list[int] = []

    async def __call__(self, server: int, prompt_ids: list[int], max_tokens: int, seed: int, priority: int) -> Any:
        rng = random.Random(seed)
        started = self.version
        try:
            if rng.random() < self.hang:
                await self.release.wait()
            else:
                await asyncio.sleep(min(self.scale_s * rng.paretovariate(1.2), self.cap_s))
        except asyncio.CancelledError:
            self.cancelled.append(seed)
            raise
        tokens = [rng.randrange(30, 120) for _ in range(rng.randint(1, 6))] + [2]
        return Generation(tokens, [-1.0] * len(tokens), "stop", started, self.version)


def make_scheduler(tmp_path: Path, renderer: ChatRenderer, fake: LongTailed, **overrides: Any) -> RolloutScheduler:
    registry = Registry()
    Registrar(registry, PluginKind.ENVIRONMENT, "tests", "tests", "0")("parity", ParityEnvironment)
    Registrar(registry, PluginKind.ALGORITHM, "tests", "tests", "0")("grpo", "telescope.algorithms.grpo:GRPO")
    values = {
        "advantage_norm": "group",
        "discard_group_zero_advantage": False,
        "group_size": 2,
        "max_concurrent_prompts_per_server": 64,
        **overrides,
    }
    config = loop_config(tmp_path, **values)
    prompts = build_prompt_source(config, build_slots(config, plugins_for(registry)), renderer)
    return RolloutScheduler(
        SchedulerSettings.from_config(config, renderer.vocab_size),
        prompts,
        renderer,
        fake,
        [0, 1],
        status_interval_s=1.0,
    )


async def drive(scheduler: RolloutScheduler, fake: LongTailed, steps: int) -> list[tuple[int, list[ReadyGroup]]]:
    """The Orchestrator's use: each step's batch, then the next policy version."""
    batches = []
    for step in range(steps):
        batches.append((step, await scheduler.next_batch(step)))
        fake.version = step + 1
        await scheduler.set_policy_version(step + 1)
    return batches


def test_first_finished_takes_the_first_groups_to_finish_and_skips_stragglers(
    tmp_path: Path, renderer: ChatRenderer
) -> None:
    fake = LongTailed(hang=0.15)
    completed: list[int] = []
    unsubscribe = events.subscribe(
        lambda e: completed.append(e["group_id"]) if e["kind"] == "orchestrator.group_completed" else None
    )

    async def scenario() -> tuple[list[ReadyGroup], list[int]]:
        scheduler = make_scheduler(tmp_path, renderer, fake, max_async_rollout=2)
        scheduler.start()
        try:
            batch = await asyncio.wait_for(scheduler.next_batch(0), 60)  # stragglers hang: only completions count
            return batch, sorted(scheduler._in_flight)
        finally:
            await scheduler.close()

    try:
        batch, in_flight = asyncio.run(scenario())
    finally:
        unsubscribe()
    ids = [g.scheduled.group_id for g in batch if g.scheduled is not None]
    assert len(ids) == 3
    assert ids == completed[:3]  # the first three to finish, in finishing order
    assert in_flight and in_flight[0] < max(ids)  # an earlier-dispatched straggler was overtaken, not waited for


def test_deterministic_mode_waits_for_the_groups_bound_to_its_step(tmp_path: Path, renderer: ChatRenderer) -> None:
    fake = LongTailed(hang=0.15)

    async def scenario() -> tuple[bool, list[ReadyGroup]]:
        scheduler = make_scheduler(tmp_path, renderer, fake, max_async_rollout=2, batch_assembly="deterministic")
        scheduler.start()
        try:
            waiting = asyncio.ensure_future(scheduler.next_batch(0))
            done, _ = await asyncio.wait({waiting}, timeout=1.0)
            blocked = not done
            fake.release.set()  # the stragglers finish; now step 0's own groups are complete
            return blocked, await asyncio.wait_for(waiting, 60)
        finally:
            await scheduler.close()

    blocked, batch = asyncio.run(scenario())
    assert blocked, "a straggler bound to step 0 holds its batch"
    assert [g.target_step for g in batch] == [0, 0, 0]


@pytest.mark.parametrize("mode", ["first_finished", "deterministic"])
def test_no_group_is_used_twice_or_lost_and_staleness_is_bounded(
    tmp_path: Path, renderer: ChatRenderer, mode: str
) -> None:
    fake = LongTailed(scale_s=0.003, cap_s=0.4)
    steps = 8

    async def scenario() -> tuple[list[tuple[int, list[ReadyGroup]]], RolloutScheduler, int, int]:
        scheduler = make_scheduler(tmp_path, renderer, fake, max_async_rollout=2, batch_assembly=mode)
        scheduler.start()
        batches = await drive(scheduler, fake, steps)
        stats = scheduler.take_stats()
        # stop dispatching, then count what is left before close cancels it
        scheduler._closed = True
        left = len(scheduler._in_flight) + len(scheduler._pool) + sum(len(v) for v in scheduler._ready.values())
        await scheduler.close()
        return batches, scheduler, stats.groups_dispatched, left + stats.discarded_groups + stats.failed_groups

    batches, scheduler, dispatched, not_trained = asyncio.run(scenario())
    draws = [g.item.draw for _, batch in batches for g in batch]
    assert all(len(batch) == 3 for _, batch in batches)
    assert len(draws) == len(set(draws)), "a group was trained twice"
    assert len(draws) + not_trained == dispatched, "a group was lost"
    assert set(draws) <= scheduler._ledger.settled
    lags = [step - g.dispatch_version for step, batch in batches for g in batch]
    assert max(lags) <= 2  # max_async_rollout
    staleness = [step - r.oldest_policy_version for step, batch in batches for g in batch for r in g.group.rollouts]
    assert max(staleness) <= 8  # max_off_policy_steps


def test_stragglers_are_cancelled_and_counted_at_the_default_settings(tmp_path: Path, renderer: ChatRenderer) -> None:
    """max_async_rollout 2, max_off_policy_steps 8: a hanging group is cancelled once 9 versions old."""
    fake = LongTailed(hang=0.05)

    async def scenario() -> tuple[int, int, list[int]]:
        # the shipped defaults (loop_config itself is synchronous): first_finished, 2, 8
        scheduler = make_scheduler(tmp_path, renderer, fake, max_async_rollout=2)
        fields = TelescopeConfig.model_fields
        assert fields["max_async_rollout"].default == 2 and fields["max_off_policy_steps"].default == 8
        assert fields["batch_assembly"].default == "first_finished"
        assert scheduler.staleness.max_off_policy_steps == 8 and scheduler.first_finished
        scheduler.start()
        canceled = 0
        for step in range(12):
            await asyncio.wait_for(scheduler.next_batch(step), 60)
            fake.version = step + 1
            await scheduler.set_policy_version(step + 1)
            canceled += scheduler.take_stats().canceled_rollouts

        def stale() -> list[int]:
            return [g.dispatch_version for g in scheduler._in_flight.values() if g.dispatch_version < 12 - 8]

        for _ in range(500):  # a cancelled group leaves once its task has run its handler
            if not stale():
                break
            await asyncio.sleep(0.01)
        stale_in_flight = stale()
        canceled += scheduler.take_stats().canceled_rollouts
        await scheduler.close()
        return canceled, len(fake.cancelled), stale_in_flight

    canceled, requests_cancelled, stale_in_flight = asyncio.run(scenario())
    assert canceled > 0 and canceled % 2 == 0  # whole groups (group_size 2), counted per rollout
    assert requests_cancelled >= 1  # the hanging requests themselves were cancelled (the client aborts them)
    assert stale_in_flight == []


def test_groups_cancelled_while_waiting_to_be_accounted_end_with_an_event(
    tmp_path: Path, renderer: ChatRenderer
) -> None:
    """A CI run lost the end event of two groups whose rollouts finished just as the run ended.

    Their tasks were waiting for the scheduler's lock to account the group when ``close()``
    cancelled them. Every dispatched group must still end with an event (here: canceled).
    """
    fake = LongTailed(hang=1.0)  # every request waits for the release
    seen: list[dict[str, Any]] = []
    unsubscribe = events.subscribe(lambda e: seen.append(e) if e["kind"].startswith("orchestrator.group_") else None)

    async def scenario() -> None:
        scheduler = make_scheduler(tmp_path, renderer, fake, max_async_rollout=2)
        scheduler.start()
        for _ in range(200):  # until some groups are in flight
            await asyncio.sleep(0.01)
            if scheduler._in_flight:
                break
        await scheduler._changed.acquire()  # what a busy orchestrator does: the groups cannot be accounted yet
        fake.release.set()
        await asyncio.sleep(0.3)  # their rollouts and rewards finish; they wait for the lock
        closing = asyncio.ensure_future(scheduler.close())
        await asyncio.sleep(0)  # close() has cancelled every task
        scheduler._changed.release()
        await asyncio.wait_for(closing, 30)

    try:
        asyncio.run(scenario())
    finally:
        unsubscribe()
    dispatched = {e["group_id"] for e in seen if e["kind"] == "orchestrator.group_dispatched"}
    ended = [
        e["group_id"]
        for e in seen
        if e["kind"] in ("orchestrator.group_completed", "orchestrator.group_discarded", "orchestrator.group_canceled")
    ]
    assert dispatched and sorted(ended) == sorted(dispatched)


@pytest.mark.parametrize("assembly", ["deterministic", "first_finished"])
def test_a_cancel_that_arrives_as_the_batch_wait_is_notified_is_not_lost(
    tmp_path: Path, renderer: ChatRenderer, assembly: str
) -> None:
    """A cancel of the run (Ctrl-C: ``asyncio.run`` cancels the main task) must end ``next_batch``.

    ``next_batch`` waited with ``asyncio.wait_for``, which on Python 3.11 returns the
    result of a wait that completes in the loop iteration the caller is cancelled in,
    dropping the cancellation: a condition notified at every finished group makes that
    iteration common.
    """
    fake = LongTailed(hang=1.0)  # nothing finishes: next_batch keeps waiting

    async def scenario() -> None:
        scheduler = make_scheduler(tmp_path, renderer, fake, batch_assembly=assembly)
        # not started: no dispatcher waits on the condition too (its turn at the lock would delay
        # next_batch's wake-up past the cancel, which then is not lost even with wait_for)
        waiting = asyncio.ensure_future(scheduler.next_batch(0))
        for _ in range(5):
            await asyncio.sleep(0)  # next_batch is now waiting on the condition
        async with scheduler._changed:
            scheduler._changed.notify_all()  # a group changed state ...
        waiting.cancel()  # ... in the iteration the run is cancelled
        try:
            await asyncio.wait({waiting}, timeout=5)
            assert waiting.cancelled(), "next_batch is still waiting: the cancellation was lost"
        finally:
            waiting.cancel()
            fake.release.set()
            await scheduler.close()

    asyncio.run(scenario())


class FailingServer(LongTailed):
    """Server 1 answers ``ServerUnavailable`` once ``release`` is set; server 0 waits for it."""

    async def __call__(self, server: int, prompt_ids: list[int], max_tokens: int, seed: int, priority: int) -> Any:
        await self.release.wait()
        if server == 1:
            raise ServerUnavailable(server, "connection refused")
        return await super().__call__(server, prompt_ids, max_tokens, seed, priority)


def test_a_group_cancelled_on_its_way_to_the_redispatch_queue_ends_with_an_event(
    tmp_path: Path, renderer: ChatRenderer
) -> None:
    """CI lost the end event of a group whose server failed just as the run ended.

    Its task had emitted ``group_redispatched`` and was waiting for the scheduler's lock to
    queue itself for another server when ``close()`` cancelled it: it was neither in flight
    nor queued, so nothing ended it. Every dispatched group must end with an event.
    """
    fake = FailingServer()
    seen: list[dict[str, Any]] = []
    unsubscribe = events.subscribe(lambda e: seen.append(e) if e["kind"].startswith("orchestrator.group_") else None)

    async def scenario() -> None:
        scheduler = make_scheduler(tmp_path, renderer, fake, max_async_rollout=2)
        scheduler.start()
        for _ in range(200):  # until groups are in flight on both servers
            await asyncio.sleep(0.01)
            if {g.server for g in scheduler._in_flight.values()} == {0, 1}:
                break
        await scheduler._changed.acquire()  # a busy orchestrator: the failed groups cannot queue themselves yet
        fake.release.set()
        await asyncio.sleep(0.3)  # server 1's groups have failed and wait for the lock
        closing = asyncio.ensure_future(scheduler.close())
        await asyncio.sleep(0)  # close() has cancelled every task
        scheduler._changed.release()
        async with asyncio.timeout(30):
            await closing

    try:
        asyncio.run(scenario())
    finally:
        unsubscribe()
    redispatched = {e["group_id"] for e in seen if e["kind"] == "orchestrator.group_redispatched"}
    dispatched = {e["group_id"] for e in seen if e["kind"] == "orchestrator.group_dispatched"}
    ended = [
        e["group_id"]
        for e in seen
        if e["kind"] in ("orchestrator.group_completed", "orchestrator.group_discarded", "orchestrator.group_canceled")
    ]
    assert redispatched, "no group met the failing server"
    assert sorted(ended) == sorted(dispatched)


def test_a_group_cancelled_before_its_task_first_ran_ends_with_an_event(tmp_path: Path, renderer: ChatRenderer) -> None:
    """The dead-server fault test lost the end event of the last group dispatched before the run ended.

    ``close()`` cancelled its task before the task's first step: a coroutine cancelled
    before it starts runs none of its code, so none of its handlers emitted the end.
    """
    seen: list[dict[str, Any]] = []
    unsubscribe = events.subscribe(lambda e: seen.append(e) if e["kind"].startswith("orchestrator.group_") else None)

    async def scenario() -> None:
        scheduler = make_scheduler(tmp_path, renderer, LongTailed())
        item = scheduler.prompts.next()
        scheduler._start_group(ScheduledGroup(item, 0, 0, 0, group_id=7), 0)  # the dispatcher's last act ...
        await scheduler.close()  # ... and the run ends before the group's task ran

    try:
        asyncio.run(scenario())
    finally:
        unsubscribe()
    assert [e["kind"] for e in seen] == ["orchestrator.group_dispatched", "orchestrator.group_canceled"]
