"""Dispatching groups of rollouts within the async budget, and assembling batches.

Two ways to assemble a batch (``batch_assembly``); both keep inference at most
``max_async_rollout`` steps ahead of training, where ``policy_version`` is the
number of weight updates the servers have received, and ``B`` is
``prompts_batch_size_for_trainer``.

``deterministic`` (bound to a step, reproducible). Every dispatched group is
assigned a *target step*: the training step whose batch it is meant for. Step
``t`` needs ``B`` accepted groups; a group counts against its step's quota while in
flight or accepted, and a discarded or cancelled group gives its place back. A
group may target step ``t`` only while ``t <= policy_version + max_async_rollout``.
The batch of step ``t`` waits for exactly its groups, so one long generation
delays the whole step. So:

- ``max_async_rollout = 0`` is synchronous: every group of step ``t`` is dispatched
  at version ``t``, after the previous step's weights are loaded;
- with ``N > 0`` a sample trained at step ``t`` was dispatched at version ``>= t - N``
  (its first turn; later turns are newer), so it is at most ``N`` versions stale.

``first_finished`` (the default: no waiting for stragglers). Accepted groups go to one
pool in the order they finish; step ``t`` takes the first ``B``. Dispatch keeps at most ``B
* (policy_version + max_async_rollout + 1 - t)`` groups in flight or pooled (the quotas'
budget, unbound from steps; in-flight groups that can no longer be trained do not count). A
pooled group dispatched before ``t - max_async_rollout`` is discarded as ``max_async`` when
step ``t`` forms, so the staleness bound is the same, and a straggler delays no batch: it
joins a later one while fresh enough. With ``max_async_rollout = 0`` both modes train the
same groups. Batches depend on completion times (not reproducible: choose ``deterministic``
for that), and lean towards short completions, long ones arriving later and staler; the
``max_async_rollout`` bound limits how far.

Stale work (the rules: :mod:`telescope.orchestrator.staleness`): at a version move, stale in-flight
groups are cancelled (their HTTP requests close, which aborts them on the server) and counted as
``canceled``; a finished group too stale for the step it would train is discarded as ``max_async``.
A finished group first goes through the output checks (:mod:`telescope.orchestrator.filters`);
groups whose training rewards are all equal are discarded as ``zero_advantage`` when
``discard_group_zero_advantage``. Two streaks stop a run that cannot learn
(:mod:`telescope.orchestrator.group_streaks`): :class:`NoLearningSignal` after
``max_consecutive_zero_advantage_batches`` batches' worth of such groups in a row, and
:class:`~telescope.orchestrator.group_streaks.AllRolloutsErrored` (quoting the environment's
error and where it was raised) after ``max_consecutive_errored_batches`` of groups whose
every rollout errored.

Servers that fail. A group whose server cannot serve (a rollout raised
:class:`~telescope.inference.generation.ServerUnavailable`) is *re-dispatched*: its other
rollouts are cancelled and the same prompt (same draw, same request seeds) runs again on an
available server for the same target step, keeping its place. So a dead server loses no
prompt and none is trained twice. Re-dispatches are counted and are events; a server's
failure is logged once until a group on it succeeds again; a group re-dispatched
:data:`MAX_REDISPATCHES` times counts as failed.

Lanes. Each training server takes ``max_concurrent_prompts_per_server`` lanes: a group holds
one, or with individual sample lanes each sample holds one (released after generation with
``free_lane_after_generation``, else after scoring). New work goes to the server with the most
free lanes. Episodes run by their environment's kind (:mod:`telescope.orchestrator.episodes`).
Bounded waits use ``asyncio.timeout``: Python 3.11's ``wait_for`` drops a cancel (Ctrl-C,
SIGTERM, the watchdog) arriving as its wait completes.

Timeline events (component ``orchestrator``, with ``group_id``, ``sample_id``, ``server``,
``target_step``): ``group_dispatched``, then ``group_completed``, ``group_discarded``
(``reason``: ``zero_advantage``, ``max_async``, ``too_few_samples`` or ``failed``) or
``group_canceled``; ``group_redispatched`` before a dispatch again. Events emitted while a
rollout runs carry its ``group_id``, ``sample_id`` and ``rollout_index``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from telescope.api import events
from telescope.api.compaction import Compactor
from telescope.api.records import Group, Rollout
from telescope.inference.generation import Generation, ServerUnavailable
from telescope.orchestrator.agent_gateway import AgentGateway
from telescope.orchestrator.batching import scored, training_rewards
from telescope.orchestrator.call_routing import CallRouter
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.episodes import EpisodeRunner
from telescope.orchestrator.group_records import ReadyGroup, ScheduledGroup, SchedulerStats, request_seed
from telescope.orchestrator.group_streaks import ErroredGroupStreak, ZeroAdvantageStreak
from telescope.orchestrator.prompts import DrawLedger, EnvironmentSlot, PromptSource
from telescope.orchestrator.rollouts import Lane, all_or_none
from telescope.orchestrator.settings import SchedulerSettings

log = logging.getLogger("telescope.orchestrator")

#: Consecutive groups that may fail outright (an inference worker down, a bug) before the run stops.
MAX_CONSECUTIVE_GROUP_FAILURES = 50

#: Times one group may be re-dispatched because its server failed before it counts as a failed group.
MAX_REDISPATCHES = 20

#: Seconds :meth:`RolloutScheduler.close` waits for the cancelled groups to stop.
CLOSE_TIMEOUT_S = 30.0

#: Seconds between checks for a server coming back when every server is unavailable.
AVAILABILITY_POLL_S = 0.5

#: generate(server, prompt_ids, max_tokens, seed, priority) -> Generation
ServerGenerateFn = Callable[[int, list[int], int, int, int], Awaitable[Generation]]


class RolloutScheduler:
    """Keeps the training servers busy within the async budget; hands out batches."""

    def __init__(
        self,
        settings: SchedulerSettings,
        prompts: PromptSource,
        renderer: ChatRenderer,
        generate: ServerGenerateFn,
        servers: list[int],
        *,
        start_step: int = 0,
        policy_version: int = 0,
        on_waiting: Callable[[str], None] | None = None,
        status_interval_s: float = 15.0,
        available: Callable[[int], bool] | None = None,
        first_group_id: int = 0,
        compactor: Compactor | None = None,
        agents: AgentGateway | None = None,
    ) -> None:
        if not servers:
            raise ValueError("the scheduler needs at least one training inference server")
        self.settings = settings
        self.prompts = prompts
        self.renderer = renderer
        self.generate = generate
        self.servers = list(servers)
        self.batch_size = settings.batch_size
        self.policy_version = policy_version
        self.next_step_to_fill = start_step
        self.stats = SchedulerStats()
        self.on_waiting = on_waiting
        self.status_interval_s = status_interval_s
        self.first_finished = settings.first_finished
        self.staleness, self.compactor = settings.staleness, compactor
        self.episodes = EpisodeRunner(renderer, settings.limits, compactor, agents, settings.free_lane_after_generation)
        self._quota: dict[int, int] = {}  # deterministic: groups per target step (in flight or accepted)
        self._ready: dict[int, list[ReadyGroup]] = {}  # deterministic: accepted groups per target step
        self._pool: list[ReadyGroup] = []  # first_finished: accepted groups in the order they finished
        self._in_flight: dict[int, ScheduledGroup] = {}
        self._lane_use = {s: 0 for s in self.servers}
        self._lane_capacity = settings.lane_capacity
        self.checks = settings.checks
        self._changed = asyncio.Condition()
        self._dispatcher: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._next_id = first_group_id  # a scheduler after a trainer restart goes on with the ids
        self._closed = False
        self._ledger = DrawLedger(prompts)
        self._consecutive_failures = 0
        self.available = available if available is not None else (lambda server: True)
        self.calls = CallRouter(self.servers, self.available, settings.episode_server_affinity)
        self._redispatch: list[ScheduledGroup] = []  # groups whose server failed, waiting for a server
        self._servers_down: set[int] = set()  # servers whose failure was logged (once per outage)
        self._zero_advantage_streak = ZeroAdvantageStreak(
            settings.max_consecutive_zero_advantage_batches, self.batch_size
        )
        self._errored_streak = ErroredGroupStreak(settings.max_consecutive_errored_batches, self.batch_size)

    # ------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._dispatcher = asyncio.create_task(self._dispatch_loop(), name="rollout-dispatcher")

    async def close(self) -> None:
        self._closed = True
        tasks = [g.task for g in self._in_flight.values() if g.task is not None]
        if self._dispatcher is not None:
            tasks.append(self._dispatcher)
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a task that ignores its cancellation must not hold the end of the run
            _, stuck = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
            for task in stuck:
                stack = "".join(f"  {f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}\n" for f in task.get_stack())
                log.error(
                    "scheduler close: %s did not stop within %g s; left behind. Its stack:\n%s",
                    task.get_name(),
                    CLOSE_TIMEOUT_S,
                    stack,
                )
            for task in tasks:
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: no "exception never retrieved" warning
        # a group still in flight here was not accounted by its task: cancelled before its first step (just
        # dispatched), its coroutine never ran; a stuck task is left as it is
        for scheduled in self._in_flight.values():
            if scheduled.task is None or scheduled.task.done():
                self._count_canceled(scheduled)
        self._in_flight.clear()
        for waiting in self._redispatch:  # groups whose server failed and that found no other before the end
            self._count_canceled(waiting)
        self._redispatch.clear()

    def _count_canceled(self, scheduled: ScheduledGroup) -> None:
        """A group that ends cancelled: its rollouts counted, its end event emitted."""
        self.stats.discards.add_canceled(self.settings.group_size)
        scheduled.emit("group_canceled", rollouts=self.settings.group_size)

    # ---------------------------------------------------------------- policy

    async def set_policy_version(self, version: int) -> None:
        """New weights are live on the servers: unlock dispatch, cancel stale work."""
        async with self._changed:
            self.policy_version = version
            for scheduled in list(self._in_flight.values()):
                if self.staleness.cancels(scheduled.dispatch_version, version) and scheduled.task is not None:
                    scheduled.task.cancel()
            self._changed.notify_all()

    # -------------------------------------------------------------- dispatch

    def _lanes_per_group(self) -> int:
        """Lanes a group holds: one per sample with individual lanes, else one (at most a server's all)."""
        wanted = self.settings.group_size if self.settings.individual_lanes else 1
        return min(wanted, self._lane_capacity)

    def _trainable(self, scheduled: ScheduledGroup) -> bool:
        """Whether a group dispatched then can still join a batch within the ``max_async_rollout`` bound.

        With ``stale_token_policy: mask`` an older one may still train, outside the budget (a long episode).
        """
        return scheduled.dispatch_version + self.settings.max_async_rollout >= self.next_step_to_fill

    def _open_target(self) -> int | None:
        """The step a new group is for, or None when the async budget is spent (see the module docstring)."""
        if self.first_finished:
            budget = (
                self.policy_version + self.settings.max_async_rollout + 1 - self.next_step_to_fill
            ) * self.batch_size
            held = len(self._pool) + len(self._redispatch)
            held += sum(1 for g in self._in_flight.values() if self._trainable(g))
            return self.next_step_to_fill + held // self.batch_size if held < budget else None
        limit = self.policy_version + self.settings.max_async_rollout
        step = self.next_step_to_fill
        while step <= limit:
            if self._quota.get(step, 0) < self.batch_size:
                return step
            step += 1
        return None

    def _free_server(self) -> int | None:
        servers = [s for s in self.servers if self.available(s)]
        if not servers:
            return None
        best = max(servers, key=lambda s: self._lane_capacity - self._lane_use[s])
        if self._lane_capacity - self._lane_use[best] >= self._lanes_per_group():
            return best
        return None

    def _has_work(self) -> bool:
        return bool(self._redispatch) or self._open_target() is not None

    async def _dispatch_loop(self) -> None:
        try:
            while not self._closed:
                async with self._changed:
                    while not (self._closed or (self._has_work() and self._free_server() is not None)):
                        # a server coming back is not announced: look again now and then
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(AVAILABILITY_POLL_S):  # not wait_for: see the module doc
                                await self._changed.wait()
                    if self._closed:
                        return
                    server = self._free_server()
                    assert server is not None
                    self._lane_use[server] += self._lanes_per_group()  # each Lane gives one back
                    if self._redispatch:  # a group whose server failed keeps its target and its prompt
                        self._start_group(self._redispatch.pop(0), server)
                        continue
                    target = self._open_target()
                    assert target is not None
                    if not self.first_finished:
                        self._quota[target] = self._quota.get(target, 0) + 1
                item = await self._ledger.draw()
                group_id = self._next_id
                self._next_id += 1
                self._start_group(ScheduledGroup(item, target, self.policy_version, server, group_id=group_id), server)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # surfaced to next_batch, which raises it in the loop
            self._failure = exc
            async with self._changed:
                self._changed.notify_all()

    def _start_group(self, scheduled: ScheduledGroup, server: int) -> None:
        """Dispatch ``scheduled`` to ``server`` (its lanes are taken); a re-dispatch keeps its ids and target."""
        redispatch = scheduled.redispatches > 0
        scheduled.server = server
        scheduled.dispatch_version = self.policy_version
        scheduled.dispatched_at = time.time()
        item = scheduled.item
        self._in_flight[scheduled.group_id] = scheduled
        if not redispatch:
            self.stats.groups_dispatched += 1
        events.emit(
            "orchestrator.group_dispatched",
            start=scheduled.dispatched_at,
            component="orchestrator",
            group_id=scheduled.group_id,
            sample_id=item.sample.sample_id,
            server=server,
            target_step=scheduled.target_step,
            dispatch_version=self.policy_version,
            environment=self.prompts.slots[item.slot].name,
            **({"redispatch": True} if redispatch else {}),
        )
        scheduled.task = asyncio.create_task(
            self._run_group(scheduled.group_id, scheduled), name=f"group-{scheduled.group_id}"
        )

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _make_lane(self, server: int) -> Lane:
        def release() -> None:
            self._lane_use[server] -= 1
            asyncio.get_running_loop().create_task(self._notify())

        return Lane(release)

    async def _run_group(self, group_id: int, scheduled: ScheduledGroup) -> None:
        item = scheduled.item
        slot = self.prompts.slots[item.slot]
        held = self._lanes_per_group()
        individual = self.settings.individual_lanes
        # One Lane per held slot; releasing is idempotent, so every exit path can release all.
        lanes = [self._make_lane(scheduled.server) for _ in range(held)]

        async def one(index: int) -> Rollout:
            async def generate(prompt_ids: list[int], max_tokens: int, turn: int) -> Generation:
                seed = request_seed(self.settings.seed, item.draw, index, turn)
                return await self.calls.call(
                    scheduled.server, lambda server: self.generate(server, prompt_ids, max_tokens, seed, turn)
                )

            lane = lanes[index] if individual and index < len(lanes) else None
            with events.context(group_id=group_id, sample_id=item.sample.sample_id, rollout_index=index):
                return await self.episodes.run(
                    slot.environment,
                    item.sample,
                    item.messages,
                    item.prompt_token_ids,
                    generate=generate,
                    policy_version=lambda: self.policy_version,
                    lane=lane,
                )

        failure: Exception | None = None
        try:
            rollouts = await all_or_none([one(i) for i in range(self.settings.group_size)])
            self._servers_down.discard(scheduled.server)  # it serves: a later failure is a new outage
        except ServerUnavailable as exc:  # not the group's fault: run it again on a server that works
            for lane in lanes:
                lane.release()
            if scheduled.redispatches >= MAX_REDISPATCHES:  # servers that look fine and fail: a failure
                failure = exc
            else:
                scheduled.emit("group_redispatched", error=str(exc))
                self._report_server_down(exc)
                log.debug("group %d (sample %s): %s; re-dispatching it", group_id, item.sample.sample_id, exc)
                scheduled.redispatches += 1
                self.stats.groups_redispatched += 1
                # queued before any await: cancelled at the lock (the run's end), close() still ends it
                self._in_flight.pop(group_id, None)
                self._redispatch.append(scheduled)
                async with self._changed:
                    self._changed.notify_all()
                return
        except asyncio.CancelledError:
            self._count_canceled(scheduled)
            self._in_flight.pop(group_id, None)
            self._ledger.settle(item)
            for lane in lanes:
                lane.release()
            async with self._changed:
                self._give_back(scheduled.target_step)
                self._changed.notify_all()
            raise
        except Exception as exc:  # a worker failure: contained, counted, the run goes on
            failure = exc
        finally:
            if not individual:
                for lane in lanes:
                    lane.release()
        if failure is not None:
            await self._fail(group_id, scheduled, lanes, failure)
            return
        try:
            await self._finish(group_id, scheduled, Group(sample=item.sample, rollouts=list(rollouts)), slot)
        except asyncio.CancelledError:
            # cancelled while _finish waited for the lock (a run's end, a stale cancel): not yet accounted
            if self._in_flight.pop(group_id, None) is not None:
                self._count_canceled(scheduled)
                self._ledger.settle(item)
                if not self._closed:  # a stale cancel: its step's budget comes back (at the end nothing waits on it)
                    async with self._changed:
                        self._give_back(scheduled.target_step)
                        self._changed.notify_all()
            raise

    def _report_server_down(self, exc: ServerUnavailable) -> None:
        """One warning per server outage, however many of its groups were in flight (each is an event)."""
        if exc.server not in self._servers_down:
            self._servers_down.add(exc.server)
            log.warning("%s; re-dispatching its groups to the other servers", exc)

    async def _fail(self, group_id: int, scheduled: ScheduledGroup, lanes: list[Lane], exc: Exception) -> None:
        """A group that failed outright: counted; too many in a row stop the run."""
        item = scheduled.item
        log.error(
            "group %d (sample %s) failed: %s: %s",
            group_id,
            item.sample.sample_id,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )
        scheduled.emit("group_discarded", reason="failed", error=f"{type(exc).__name__}: {exc}")
        self.stats.failed_groups += 1
        self._consecutive_failures += 1
        self._in_flight.pop(group_id, None)
        self._ledger.settle(item)
        for lane in lanes:
            lane.release()
        async with self._changed:
            self._give_back(scheduled.target_step)
            if self._consecutive_failures >= MAX_CONSECUTIVE_GROUP_FAILURES:
                self._failure = RuntimeError(
                    f"{self._consecutive_failures} groups in a row failed; the last error: {type(exc).__name__}: {exc}"
                )
            self._changed.notify_all()

    async def _finish(self, group_id: int, scheduled: ScheduledGroup, group: Group, slot: EnvironmentSlot) -> None:
        self._consecutive_failures = 0
        errored = [r for r in group.rollouts if r.error]
        self.stats.errored_rollouts.extend(errored)
        all_errored = self._errored_streak.observe(slot.name, group.rollouts)
        self.stats.discards.add_dropped("error", errored)
        # overlong / gibberish / repetition filters and the overlong penalty (filters.py)
        ranges = {group.sample.environment: (slot.reward_min, slot.reward_max)}
        checked = [self.checks.apply(r) for r in group.rollouts if not r.error]
        group = scored(Group(sample=group.sample, rollouts=checked), ranges)  # scaled once, carried
        async with self._changed:
            # leaves in-flight and enters the pool at once: first_finished's budget counts both
            self._in_flight.pop(group_id, None)
            reason = None
            if len(group.rollouts) < 2:
                reason = "too_few_samples"  # errors left too few samples to compare
                self.stats.discards.add_dropped(reason, group.rollouts)
            elif self.settings.discard_group_zero_advantage and len(set(training_rewards(group, ranges))) <= 1:
                self.stats.discards.add_zero_advantage(group)
                self.stats.discarded_groups += 1
                reason = "zero_advantage"
                no_signal = self._zero_advantage_streak.discarded(self.stats.discards.zero_advantage_groups[-50:])
                self._failure = self._failure or no_signal
            self._failure = self._failure or all_errored
            rewards = [r.reward.total_reward if r.reward is not None else None for r in group.rollouts]
            if reason is None:
                self._zero_advantage_streak.reset()
                scheduled.emit("group_completed", rollouts=len(group.rollouts), errored=len(errored), rewards=rewards)
                ready = ReadyGroup(
                    group, slot.index, scheduled.target_step, scheduled.dispatch_version, scheduled.item, scheduled
                )
                if self.first_finished:
                    self._pool.append(ready)
                else:
                    self._ready.setdefault(scheduled.target_step, []).append(ready)
            else:
                scheduled.emit("group_discarded", reason=reason, errored=len(errored), rewards=rewards)
                self._give_back(scheduled.target_step)
                self._ledger.settle(scheduled.item)
            self._changed.notify_all()

    def _give_back(self, target_step: int) -> None:
        """A discarded, failed or cancelled group gives its place back (first_finished counts groups instead)."""
        if not self.first_finished:
            self._quota[target_step] -= 1

    @property
    def next_group_id(self) -> int:
        return self._next_id

    def in_flight(self) -> list[dict[str, object]]:
        """The groups being generated or scored, the oldest first (for the watchdog's report)."""
        now = time.time()
        groups = sorted(self._in_flight.values(), key=lambda g: g.dispatched_at)
        return [
            {
                "group_id": g.group_id,
                "sample_id": g.item.sample.sample_id,
                "server": g.server,
                "target_step": g.target_step,
                "age_s": round(now - g.dispatched_at, 1),
            }
            for g in groups
        ]

    def _report_waiting(self, step: int, accepted: int) -> None:
        s = self.stats
        message = (
            f"step {step}: waiting for data, {accepted}/{self.batch_size} groups accepted; this step so far "
            f"{s.groups_dispatched} dispatched, {len(s.discards.zero_advantage_groups)} dropped (all rewards equal), "
            f"{len(s.errored_rollouts)} rollouts errored, {s.failed_groups} groups failed, "
            f"{len(self._in_flight)} in flight"
        )
        log.info(message)
        if self.on_waiting is not None:
            self.on_waiting(message)

    def take_stats(self) -> SchedulerStats:
        """The record since the last call; counting starts afresh."""
        stats, self.stats = self.stats, SchedulerStats()
        return stats

    # ---------------------------------------------------------------- ledger

    async def prompt_state(self) -> dict[str, object]:
        """The prompt position to checkpoint (:meth:`DrawLedger.state`)."""
        return await self._ledger.state()

    # --------------------------------------------------------------- batches

    def _discard_stale(self, step: int, candidates: list[ReadyGroup], max_dispatch_lag: int | None) -> list[ReadyGroup]:
        """Drop (and count) the groups too stale to train at ``step``; returns the rest, in order.

        Stale: :meth:`Staleness.too_stale`, or (``max_dispatch_lag`` given, and bounded by the
        policy) dispatched more than that many versions before ``step``.
        """
        lag = max_dispatch_lag if self.staleness.bounds_dispatch else None
        fresh = [
            g
            for g in candidates
            if not self.staleness.too_stale(g.group, step) and (lag is None or step - g.dispatch_version <= lag)
        ]
        kept = {id(g) for g in fresh}
        for stale in (g for g in candidates if id(g) not in kept):
            if stale.scheduled is not None:
                stale.scheduled.emit("group_discarded", reason="max_async", step=step)
            self.stats.discards.add_stale(stale.group.rollouts)
            self.stats.discarded_groups += 1
            self._ledger.settle(stale.item)
        if len(fresh) < len(candidates):
            self._changed.notify_all()
        return fresh

    def _candidates(self, step: int) -> list[ReadyGroup]:
        """The fresh accepted groups step ``step`` may take (stale ones dropped and counted)."""
        if self.first_finished:
            self._pool = self._discard_stale(step, self._pool, self.settings.max_async_rollout)
            return self._pool
        ready = self._ready.get(step, [])
        fresh = self._discard_stale(step, ready, None)  # the quota already bounds the dispatch lag
        if len(fresh) < len(ready):
            self._quota[step] -= len(ready) - len(fresh)
            self._ready[step] = fresh
        return fresh

    async def next_batch(self, step: int) -> list[ReadyGroup]:
        """Wait for ``prompts_batch_size_for_trainer`` accepted groups for ``step``; returns them (no advantages yet).

        ``deterministic``: the groups bound to ``step``; ``first_finished``: the first to finish.
        """
        last_report = time.monotonic()
        async with self._changed:
            self.next_step_to_fill = max(self.next_step_to_fill, step)
            self._changed.notify_all()
            while True:
                if self._failure is not None:
                    raise self._failure
                ready = self._candidates(step)
                if len(ready) >= self.batch_size:
                    break
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.status_interval_s):  # not wait_for: see the module doc
                        await self._changed.wait()
                if time.monotonic() - last_report >= self.status_interval_s:
                    self._report_waiting(step, len(ready))
                    last_report = time.monotonic()
            batch = ready[: self.batch_size]  # deterministic: the quota never lets more than batch_size finish
            for used in batch:
                self._ledger.settle(used.item)
            if self.first_finished:
                self._pool = ready[self.batch_size :]
            else:
                del self._ready[step]
                self._quota.pop(step, None)
            self.next_step_to_fill = step + 1
            self._changed.notify_all()
            return batch
