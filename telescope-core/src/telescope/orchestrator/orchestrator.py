"""The training loop: batches in, steps out, weights back to inference, every step recorded.

Reads as the loop it runs (:meth:`TrainingRun.run`)::

    evaluate (before training)
    for step in steps:
        groups  = await scheduler.next_batch(step)     # inference keeps generating meanwhile
        batch   = advantages(groups)                   # algorithm + per-environment reward scaling
        metrics = await services.train_step(batch)
        await services.push_weights(step + 1)          # in place, no restart
        await scheduler.set_policy_version(step + 1)   # unlocks dispatch, cancels stale work
        record(step, metrics)                          # run store, loggers, hooks, progress bar
        checkpoint / periodic evals when due
    evaluate (after training)

Resume: a checkpoint holds the trainer state (weights, optimizer, LR schedule, RNG)
and a sidecar with the orchestrator's state (step, prompt position, counters); the run continues at the
next step with the restored weights pushed to every server first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from telescope.api.algorithm import Algorithm
from telescope.api.records import TrainingBatch, TrainingSample
from telescope.config.schema import TelescopeConfig
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.evals import EvalRunner
from telescope.orchestrator.prompts import PromptSource
from telescope.orchestrator.rollouts import Generation
from telescope.orchestrator.run_checkpoints import CheckpointManager
from telescope.orchestrator.scheduler import ReadyGroup, RolloutScheduler
from telescope.orchestrator.services import SamplingSettings, Services
from telescope.recording.recorder import StepOutcome, StepRecorder
from telescope.recording.rollout_metrics import normalize_reward


@dataclass
class RunCounters:
    """Totals kept across steps (and checkpoints)."""

    samples_trained: int = 0
    tokens_trained: int = 0
    groups_discarded: int = 0
    rollouts_canceled: int = 0
    rollouts_errored: int = 0


class TrainingRun:
    """Drives one run over a set of :class:`Services`."""

    def __init__(
        self,
        config: TelescopeConfig,
        services: Services,
        prompts: PromptSource,
        renderer: ChatRenderer,
        algorithm: Algorithm,
        recorder: StepRecorder,
        checkpoints: CheckpointManager,
        evals: EvalRunner | None = None,
    ) -> None:
        self.config = config
        self.services = services
        self.prompts = prompts
        self.renderer = renderer
        self.algorithm = algorithm
        self.recorder = recorder
        self.checkpoints = checkpoints
        self.evals = evals
        self.counters = RunCounters()
        self.start_step = 0
        self.train_servers, self.eval_servers = self._split_servers()
        self.training_sampling = SamplingSettings(config.temperature, config.top_p)
        self._eval_tasks: list[asyncio.Task[Any]] = []

    # ----------------------------------------------------------------- setup

    def _split_servers(self) -> tuple[list[int], list[int]]:
        n = self.services.num_servers
        reserve = self.config.eval_num_servers if self.config.evals else 0
        reserve = min(reserve, n - 1)
        return list(range(n - reserve)), list(range(n - reserve, n))

    async def _generate(
        self, server: int, prompt_ids: list[int], max_tokens: int, seed: int, priority: int
    ) -> Generation:
        return await self.services.generate(
            server, prompt_ids, max_tokens, seed=seed, priority=priority, sampling=self.training_sampling
        )

    async def restore(self) -> None:
        """Resume from ``resume_from_checkpoint`` if set (no-op otherwise)."""
        path = self.checkpoints.resume_path()
        if path is None:
            return
        await self.services.load_checkpoint(path)
        state = self.checkpoints.read_state(path)
        self.start_step = int(state["step"])
        self.prompts.load_state_dict(state["prompts"])
        self.counters = RunCounters(**state.get("counters", {}))
        await self.services.push_weights(self.start_step)

    # ------------------------------------------------------------------ loop

    async def run(self) -> None:
        await self.restore()
        scheduler = RolloutScheduler(
            self.config, self.prompts, self.renderer, self._generate, self.train_servers,
            start_step=self.start_step, policy_version=self.start_step, on_waiting=self.recorder.note,
        )  # fmt: skip
        if self.evals and self.config.eval_before_training and self.start_step == 0:
            await self.evals.run_all(step=0, servers=self._start_end_servers(), phase="before")
        scheduler.start()
        try:
            for step in range(self.start_step, self.config.number_of_steps):
                await self._train_one_step(scheduler, step)
                if self.checkpoints.due(step + 1):
                    await self._save(scheduler, step + 1)
                self._maybe_periodic_evals(step + 1)
            await scheduler.close()
            await self._finish_periodic_evals()
            if self.checkpoints.enabled and not self.checkpoints.exists(self.config.number_of_steps):
                await self._save(scheduler, self.config.number_of_steps)
            if self.evals and self.config.eval_after_training:
                await self.evals.run_all(
                    step=self.config.number_of_steps, servers=self._start_end_servers(), phase="after"
                )
        finally:
            await scheduler.close()
            for task in self._eval_tasks:
                task.cancel()

    async def _train_one_step(self, scheduler: RolloutScheduler, step: int) -> None:
        step_start = time.perf_counter()
        ready = await scheduler.next_batch(step)
        waited = time.perf_counter() - step_start
        batch = self.build_batch(step, ready)
        train_start = time.perf_counter()
        trainer_metrics = await self.services.train_step(batch)
        train_time = time.perf_counter() - train_start
        sync_start = time.perf_counter()
        sync = await self.services.push_weights(step + 1)
        sync_time = time.perf_counter() - sync_start
        await scheduler.set_policy_version(step + 1)
        stats = scheduler.take_stats()
        self.counters.samples_trained += len(batch.samples)
        self.counters.tokens_trained += batch.num_tokens
        self.counters.groups_discarded += stats.discarded_groups
        self.counters.rollouts_canceled += stats.canceled_rollouts
        self.counters.rollouts_errored += len(stats.errored_rollouts)
        timing = {
            "timing_step_total": time.perf_counter() - step_start,
            "timing_step_active": time.perf_counter() - step_start - waited,
            "timing_waiting_for_data": waited,
            "timing_train_step_total": train_time,
            "timing_weight_sync_total": sync_time,
            **{k: float(v) for k, v in sync.items()},
        }
        self.recorder.record_step(StepOutcome(step, ready, trainer_metrics, timing, stats, self.counters, step))

    def build_batch(self, step: int, ready: list[ReadyGroup]) -> TrainingBatch:
        """Advantages for the step's groups, then the flat training samples."""
        from telescope.algorithms.common import compute_advantages

        slots = self.prompts.slots
        rewards = [
            [normalize_reward(r.reward.total_reward if r.reward else 0.0, slots[g.slot].reward_min,
                              slots[g.slot].reward_max) for r in g.group.rollouts]
            for g in ready
        ]  # fmt: skip
        advantages = compute_advantages(self.algorithm, rewards)
        samples: list[TrainingSample] = []
        for group_index, (g, group_advantages) in enumerate(zip(ready, advantages, strict=True)):
            for rollout, advantage in zip(g.group.rollouts, group_advantages, strict=True):
                rollout.advantage = float(advantage)
                samples.append(TrainingSample.from_rollout(rollout, group_index))
        return TrainingBatch(samples=samples, step=step, policy_version=step)

    # ----------------------------------------------------------- checkpoints

    async def _save(self, scheduler: RolloutScheduler, step: int) -> None:
        prompt_state = await scheduler.prompt_state()
        state = {
            "step": step,
            "prompts": prompt_state,
            "counters": dataclasses.asdict(self.counters),
        }
        await self.checkpoints.save(step, self.services, state)

    # ----------------------------------------------------------------- evals

    def _start_end_servers(self) -> list[int]:
        if self.config.eval_start_end_use_all_servers or not self.eval_servers:
            return list(range(self.services.num_servers))
        return self.eval_servers

    def _maybe_periodic_evals(self, step: int) -> None:
        if not self.evals or not self.eval_servers or step >= self.config.number_of_steps:
            return
        due = [e for e in self.config.evals if step % e.eval_every == 0]
        if due:
            assert self.evals is not None
            task = asyncio.create_task(
                self.evals.run_all(step=step, servers=self.eval_servers, phase="periodic", entries=due)
            )
            self._eval_tasks.append(task)

    async def _finish_periodic_evals(self) -> None:
        for task in self._eval_tasks:
            await task
        self._eval_tasks.clear()

    def summary(self) -> dict[str, Any]:
        return {"start_step": self.start_step, **dataclasses.asdict(self.counters)}
