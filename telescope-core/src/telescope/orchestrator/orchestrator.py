"""The Orchestrator: the run's loop, from prompts to trained steps and back to the servers.

Reads as the loop it runs (:meth:`Orchestrator.run`)::

    restore (resume) or warm start (supervised steps on demonstrations)
    publish the trainer's weights to every server       # a fresh run: after the scheduler starts
    evaluate (before training)
    prepare environment resources (eager_prepare_resources)
    start the rollout scheduler
    for step in steps:
        groups  = await scheduler.next_batch(step)          # inference keeps generating meanwhile
        batch   = build_training_batch(step, groups, ...)   # reward scaling + the algorithm's advantages
        metrics = await training.train_step(batch)
        await training.push_weights(step + 1)               # in place, no restart
        await scheduler.set_policy_version(step + 1)        # unlocks dispatch, cancels stale work
        record(step, metrics)                               # run store, loggers, hooks, progress bar
        checkpoint / periodic evals when due
    evaluate (after training)

It talks to the workers through two handles, :class:`~telescope.inference.generation.GenerationService`
and :class:`~telescope.orchestrator.services.TrainingService`.

Timeline events (component ``orchestrator``): ``orchestrator.step`` (the whole step,
timed, with ``step``), ``orchestrator.batch_assembled`` (groups, samples, tokens),
``weights.sync`` (pushing a version to every server) and
``orchestrator.checkpoint``; every event emitted while a step runs in this loop (the
trainer's phases, weight sends and loads) carries its ``step``.

Resume: a checkpoint holds the trainer state (weights, optimizer, LR schedule, RNG)
and a sidecar with the orchestrator's state (step, prompt position, counters); the run
continues at the next step with the restored weights pushed to every server first.

Faults (``docs/faults.md``): the loop runs under a :class:`~telescope.orchestrator.watchdog.Watchdog`
(``watchdog_timeout_s``), which fails the run naming the stuck component when nothing
progresses. When a trainer rank dies (:class:`~telescope.orchestrator.services.TrainerFailure`),
the loop restarts the trainer group (the training service's ``restart_trainer``), loads
the last checkpoint, rewinds the prompt stream and the counters to it, pushes its
weights, and goes on from its step, at most ``trainer_max_restarts`` times; with no
checkpoint, or none left, the run fails with :class:`TrainerLost` (the launcher
prints the command that resumes). Each start, resume and trainer restart is a new
attempt in the run store (:mod:`telescope.recording.run_attempts`): the rows the
abandoned attempt wrote for the steps trained again read as abandoned. Step metrics carry the services' fault counters
(``infra/server_restarts``, ``infra/trainer_restarts``) and the scheduler's
``infra/groups_redispatched``.

Evals on dedicated servers (``eval_num_servers``): the last servers are kept out of
training, and a periodic eval due at step ``s`` runs on them beside training, with
the weights of step ``s`` for all its requests: while it runs, weight pushes pass the
eval servers by (they take part in the transfer and keep their weights,
``held_servers``). A push the eval servers need (the next eval's step, or the last
step before the "after" eval) waits for the running eval to finish first. Each eval's
requests carry ``eval_step`` and ``eval_phase`` in their events.

Start-up: the trainer ranks may still be setting up when the loop begins
(:meth:`~telescope.orchestrator.services.TrainingService.wait_ready` says when they
are done). A fresh run (no checkpoint to resume, no warm start) does not wait for
them before generating: its servers loaded the same model files as the trainer, so
they already hold version 0, and the evals before training, the environments'
resources and the first groups run while the trainer starts. Once it is ready, its
weights are published as version 0 all the same (the same values for the built-in
backends; a backend that changes the weights at set-up makes the groups generated
before that off by that change, which the step's ``kl_divergence_inference`` shows).
A resume or a warm start waits for the trainer first. The wait is start-up, not
progress the watchdog times.

Warm start: with ``warm_start_steps > 0`` (and no checkpoint to resume), the
trainer takes that many supervised steps on the environments' demonstrations
through :meth:`~telescope.api.trainer.TrainerBackend.supervised_step` before the
first weights are published, so "before training" evals measure the warm-started
model and RL starts from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telescope.api import events
from telescope.api.agent import AgentEnvironment
from telescope.api.algorithm import Algorithm
from telescope.api.compaction import Compactor
from telescope.api.records import Sample, SupervisedExample
from telescope.inference.generation import Generation, GenerationService, SamplingSettings
from telescope.orchestrator.agent_gateway import AgentGateway, record_demonstration, start_agent_gateway
from telescope.orchestrator.batching import build_training_batch
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.evals import EvalRunner
from telescope.orchestrator.prompts import PromptSource
from telescope.orchestrator.run_checkpoints import RunCheckpoints
from telescope.orchestrator.scheduler import RolloutScheduler
from telescope.orchestrator.services import TrainerFailure, TrainingService
from telescope.orchestrator.settings import OrchestratorSettings, SchedulerSettings
from telescope.orchestrator.step_recorder import StepOutcome, StepRecorder
from telescope.orchestrator.warm_start import demonstration_examples, warm_start_batches
from telescope.orchestrator.watchdog import StuckReport, Watchdog
from telescope.schema.config import TelescopeConfig

log = logging.getLogger("telescope.orchestrator")


#: Seconds between the watchdog beats of :meth:`Orchestrator._wait_for_trainer`.
READY_BEAT_S = 5.0


class TrainerLost(RuntimeError):
    """A trainer rank died and the trainer group could not restart; ``checkpoint`` is what a resume would use."""

    def __init__(self, message: str, checkpoint: Path | None) -> None:
        super().__init__(message)
        self.checkpoint = checkpoint


@dataclass
class RunCounters:
    """Totals kept across steps (and checkpoints)."""

    samples_trained: int = 0
    tokens_trained: int = 0
    groups_discarded: int = 0
    rollouts_canceled: int = 0
    rollouts_errored: int = 0


class Orchestrator:
    """Drives one run over a generation and a training service (see the module docstring)."""

    def __init__(
        self,
        config: TelescopeConfig,
        generation: GenerationService,
        training: TrainingService,
        prompts: PromptSource,
        renderer: ChatRenderer,
        algorithm: Algorithm,
        recorder: StepRecorder,
        checkpoints: RunCheckpoints,
        evals: EvalRunner | None = None,
        *,
        compactor: Compactor | None = None,
    ) -> None:
        self.settings = OrchestratorSettings.from_config(config)
        self.scheduler_settings = SchedulerSettings.from_config(config, renderer.vocab_size)
        self.compactor = compactor
        self.staleness = self.scheduler_settings.staleness
        self.generation = generation
        self.training = training
        self.prompts = prompts
        self.renderer = renderer
        self.algorithm = algorithm
        self.recorder = recorder
        self.checkpoints = checkpoints
        self.evals = evals
        self.counters = RunCounters()
        self.start_step = 0
        self.train_servers, self.eval_servers = self._split_servers()
        self.training_sampling = SamplingSettings(self.settings.temperature, self.settings.top_p)
        self._eval_tasks: list[asyncio.Task[Any]] = []
        self.trainer_restarts = 0
        self.scheduler: RolloutScheduler | None = None
        self.agents: AgentGateway | None = None
        self._phase = "starting"
        self._waiting_on: str | None = None
        self.watchdog = Watchdog(
            self.settings.watchdog_timeout_s,
            probes=self._probes(),
            describe=self._describe,
            on_stuck=self._report_stuck,
        )

    # ----------------------------------------------------------------- setup

    def _split_servers(self) -> tuple[list[int], list[int]]:
        n = self.generation.num_servers
        reserve = self.settings.eval_num_servers if self.settings.evals else 0
        reserve = min(reserve, n - 1)
        return list(range(n - reserve)), list(range(n - reserve, n))

    async def _generate(
        self, server: int, prompt_ids: list[int], max_tokens: int, seed: int, priority: int
    ) -> Generation:
        return await self.generation.generate(
            server, prompt_ids, max_tokens, seed=seed, priority=priority, sampling=self.training_sampling
        )

    async def restore(self, path: Path | None) -> bool:
        """Resume from checkpoint ``path`` (None: not resuming); returns whether it did."""
        if path is None:
            return False
        await self.training.load_checkpoint(path)
        state = self.checkpoints.read_state(path)
        self.start_step = int(state["step"])
        log.info("resuming from step %d (%s)", self.start_step, path)
        self.recorder.note(f"resuming from step {self.start_step} ({path.name})")
        self.prompts.load_state_dict(state["prompts"])
        self.counters = RunCounters(**state.get("counters", {}))
        return True

    async def warm_start(self) -> None:
        """``warm_start_steps`` supervised steps on demonstrations, through the trainer backend."""
        c = self.settings
        agents = self.agents

        async def record(environment: AgentEnvironment, sample: Sample, replies: list[str]) -> list[SupervisedExample]:
            assert agents is not None  # started for any agent environment
            return await record_demonstration(
                environment, sample, replies, gateway=agents, max_model_len=c.max_model_len
            )

        examples = await demonstration_examples(
            self.prompts.slots, self.renderer, c.warm_start_batch_size * c.warm_start_steps, c.seed, record
        )
        batches = warm_start_batches(examples, c.warm_start_steps, c.warm_start_batch_size, c.seed)
        for step, batch in enumerate(batches):
            with self._doing(f"taking warm-start step {step + 1}/{c.warm_start_steps}", "trainer"):
                metrics = await self.training.supervised_step(batch, c.warm_start_learning_rate)
            self.watchdog.beat()
            if step % 20 == 0 or step == c.warm_start_steps - 1:
                self.recorder.note(f"warm start step {step + 1}/{c.warm_start_steps}: loss {metrics['loss']:.4f}")

    # ------------------------------------------------------------------ loop

    async def run(self) -> None:
        """The whole run, under the watchdog (see the module docstring)."""
        await self.watchdog.guard(self._run())

    async def _run(self) -> None:
        self.agents = await start_agent_gateway(
            (slot.environment for slot in self.prompts.slots),
            self.renderer.tokenizer,
            chat_template=self.settings.chat_template,
            max_model_len=self.settings.max_model_len,
            model_name=self.settings.model,
        )
        if self.evals is not None:
            self.evals.agents = self.agents
        try:
            await self._start_and_train()
        finally:
            if self.agents is not None:
                await self.agents.close()

    async def _start_and_train(self) -> None:
        # A fresh run's servers already hold version 0 (their own load of the model), so they
        # generate while the trainer ranks start; a resume or a warm start changes the weights first.
        resume = self.checkpoints.resume_path()
        early = resume is None and self.settings.warm_start_steps == 0
        if not early:
            await self._wait_for_trainer()
            resumed = await self.restore(resume)
            if not resumed and self.settings.warm_start_steps > 0:
                await self.warm_start()
            await self._publish(self.start_step)
        self.recorder.store.begin_attempt(self.start_step, "start" if resume is None else "resume")
        await self._generate_and_train(early)

    async def _generate_and_train(self, early: bool) -> None:
        """Generate and train every step (``early``: the trainer's first weights are published once it is ready)."""
        scheduler = await self._start_generating()
        try:
            if early:
                await self._wait_for_trainer()
                await self._publish(self.start_step)  # the trainer's own weights, to the last bit
            step = self.start_step
            while step < self.settings.number_of_steps:
                try:
                    with events.context(step=step), events.timed("orchestrator.step", component="orchestrator"):
                        await self._train_one_step(scheduler, step)
                    if self.checkpoints.due(step + 1):
                        await self._save(scheduler, step + 1)
                except TrainerFailure as failure:
                    scheduler = self.scheduler = await self._restart_trainer(scheduler, failure)
                    step = self.start_step
                    continue
                self._maybe_periodic_evals(step + 1)
                step += 1
            await scheduler.close()
            await self._finish_periodic_evals()
            if self.checkpoints.enabled and not self.checkpoints.exists(self.settings.number_of_steps):
                await self._save(scheduler, self.settings.number_of_steps)
            if self.evals and self.settings.eval_after_training:
                with self._doing("running the evals after training"):
                    await self.evals.run_all(
                        step=self.settings.number_of_steps, servers=self._start_end_servers(), phase="after"
                    )
        finally:
            await scheduler.close()
            for task in self._eval_tasks:
                task.cancel()

    async def _start_generating(self) -> RolloutScheduler:
        """The evals before training, the environments' resources, then the rollout scheduler, started."""
        scheduler = self.scheduler = self._new_scheduler()
        if self.evals and self.settings.eval_before_training and self.start_step == 0:
            with self._doing("running the evals before training"):
                await self.evals.run_all(step=0, servers=self._start_end_servers(), phase="before")
        if self.settings.eager_prepare_resources:
            with self._doing("preparing the environments' resources"):
                await self.prepare_resources()
        scheduler.start()
        return scheduler

    async def _wait_for_trainer(self) -> None:
        """Until the training service is ready (:meth:`TrainingService.wait_ready`), outside the watchdog.

        Setting up the trainer (loading a large model, say) is start-up, which the watchdog does
        not time: it is told of progress every :data:`READY_BEAT_S` while the wait lasts.
        """
        ready = asyncio.ensure_future(self.training.wait_ready())
        with self._doing("waiting for the trainer ranks to start", "trainer"):
            while not ready.done():
                await asyncio.wait({ready}, timeout=READY_BEAT_S)
                self.watchdog.beat()
        ready.result()

    async def prepare_resources(self) -> None:
        """Every training environment's ``prepare_resources()``, together, each in a worker thread.

        One ``orchestrator.prepare_resources`` timeline event per environment. A failure
        stops the run: the user asked for the resources up front.
        """

        async def prepare(slot: Any) -> None:
            with events.timed("orchestrator.prepare_resources", component="orchestrator", environment=slot.name):
                try:
                    await asyncio.to_thread(slot.environment.prepare_resources)
                except Exception as exc:
                    raise RuntimeError(
                        f"environment {slot.name!r}: prepare_resources() failed (eager_prepare_resources): "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc

        await asyncio.gather(*(prepare(slot) for slot in self.prompts.slots))

    def _new_scheduler(self, first_group_id: int = 0) -> RolloutScheduler:
        scheduler = RolloutScheduler(
            self.scheduler_settings,
            self.prompts,
            self.renderer,
            self._generate,
            self.train_servers,
            start_step=self.start_step,
            policy_version=self.start_step,
            on_waiting=self.recorder.note,
            available=self.generation.is_available,
            first_group_id=first_group_id,
            compactor=self.compactor,
            agents=self.agents,
        )
        return scheduler

    async def _publish(self, version: int, held_servers: Sequence[int] = ()) -> dict[str, float]:
        """Push the trainer's weights to every server as ``version`` (``held_servers`` keep theirs)."""
        with (
            self._doing(f"pushing weights version {version} to the servers", "trainer"),
            events.timed("weights.sync", component="orchestrator", version=version, held_servers=list(held_servers)),
        ):
            return await self.training.push_weights(version, held_servers=held_servers)

    # --------------------------------------------------------------- faults

    async def _restart_trainer(self, scheduler: RolloutScheduler, failure: TrainerFailure) -> RolloutScheduler:
        """A rank died: new trainer ranks, the last checkpoint, and a new scheduler from its step."""
        self.trainer_restarts += 1
        checkpoint = self.checkpoints.latest()
        limit = self.settings.trainer_max_restarts
        why = None
        if not self.training.can_restart_trainer:
            why = "this training service cannot restart its ranks"
        elif not self.checkpoints.enabled:
            why = "checkpoints are off (checkpoint_every: 0), so there is nothing to restart from"
        elif checkpoint is None:
            why = "no checkpoint has been saved yet to restart from"
        elif self.trainer_restarts > limit:
            why = f"the trainer group already restarted {limit} time(s) (trainer_max_restarts: {limit})"
        if why is not None:
            raise TrainerLost(f"{failure}; the trainer group cannot restart: {why}", checkpoint) from failure
        assert checkpoint is not None
        self.recorder.note(
            f"trainer failed ({failure}); restarting the trainer group from {checkpoint.name} "
            f"(restart {self.trainer_restarts}/{limit})"
        )
        log.warning("trainer failed: %s; restarting from %s", failure, checkpoint)
        first_group_id = scheduler.next_group_id
        await scheduler.close()
        for task in self._eval_tasks:  # they ran with weights that are about to be rolled back
            task.cancel()
        self._eval_tasks.clear()
        with events.timed(
            "orchestrator.trainer_restart",
            component="orchestrator",
            checkpoint=str(checkpoint),
            restart=self.trainer_restarts,
            error=str(failure),
        ):
            with self._doing("restarting the trainer group", "trainer"):
                await self.training.restart_trainer()
                await self.training.load_checkpoint(checkpoint)
            state = self.checkpoints.read_state(checkpoint)
            self.start_step = int(state["step"])
            self.recorder.store.begin_attempt(self.start_step, "trainer_restart")  # steps from here: trained again
            self.prompts.rewind(state["prompts"])
            self.counters = RunCounters(**state.get("counters", {}))
            await self._publish(self.start_step)
        new = self._new_scheduler(first_group_id)
        new.start()
        return new

    def _fault_metrics(self) -> dict[str, float]:
        metrics = {"infra/trainer_restarts": float(self.trainer_restarts)}
        metrics.update(self.generation.fault_metrics())
        if self.training is not self.generation:  # one object may be both (a fake, an in-process run)
            metrics.update(self.training.fault_metrics())
        return metrics

    # ------------------------------------------------------------- watchdog

    @contextlib.contextmanager
    def _doing(self, phase: str, waiting_on: str | None = None) -> Iterator[None]:
        """What the orchestrator is doing now (the watchdog's report names it)."""
        previous = self._phase, self._waiting_on
        self._phase, self._waiting_on = phase, waiting_on
        try:
            yield
        finally:
            self._phase, self._waiting_on = previous

    def _describe(self) -> dict[str, Any]:
        return {
            "phase": self._phase,
            "waiting_on": self._waiting_on,
            "in_flight": self.scheduler.in_flight() if self.scheduler is not None else [],
        }

    def _probes(self) -> list[Any]:
        if self.generation is self.training:  # one object may be both (a fake, an in-process run)
            return [self.generation.probe]
        return [self.generation.probe, self.training.probe]

    def _report_stuck(self, report: StuckReport) -> None:
        self.recorder.store.set_status("running", stuck=report.as_dict())
        self.recorder.note(f"watchdog: {report.message}")

    async def _train_one_step(self, scheduler: RolloutScheduler, step: int) -> None:
        step_start = time.perf_counter()
        with self._doing(f"waiting for the groups of step {step}", "inference"):
            ready = await scheduler.next_batch(step)
        waited = time.perf_counter() - step_start
        with events.timed("orchestrator.batch_assembled", component="orchestrator", groups=len(ready)) as event:
            groups, oldest_allowed = [g.group for g in ready], self.staleness.oldest_allowed(step)
            batch = build_training_batch(step, groups, self.algorithm, self.reward_ranges, oldest_allowed)
            event.update(
                samples=len(batch.samples),
                tokens=batch.num_tokens,
                group_ids=[g.scheduled.group_id for g in ready if g.scheduled is not None],
            )
        train_start = time.perf_counter()
        with self._doing(f"training step {step}", "trainer"):
            trainer_metrics = await self.training.train_step(batch)
        train_time = time.perf_counter() - train_start
        held = await self._eval_servers_to_hold(step + 1)  # may first wait for a running eval
        sync_start = time.perf_counter()
        sync = await self._publish(step + 1, held_servers=held)
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
            **self._fault_metrics(),
        }
        self.recorder.record_step(StepOutcome(step, ready, batch, trainer_metrics, timing, stats, self.counters, step))

    @property
    def reward_ranges(self) -> dict[str, tuple[float | None, float | None]]:
        return {s.name: (s.reward_min, s.reward_max) for s in self.prompts.slots}

    # ----------------------------------------------------------- checkpoints

    async def _save(self, scheduler: RolloutScheduler, step: int) -> None:
        prompt_state = await scheduler.prompt_state()
        state = {
            "step": step,
            "prompts": prompt_state,
            "counters": dataclasses.asdict(self.counters),
        }
        with (
            events.timed("orchestrator.checkpoint", component="orchestrator", checkpoint_step=step),
            self._doing(f"saving checkpoint {step}", "trainer"),
        ):
            await self.checkpoints.save(step, self.training, state)

    # ----------------------------------------------------------------- evals

    def _start_end_servers(self) -> list[int]:
        if self.settings.eval_start_end_use_all_servers or not self.eval_servers:
            return list(range(self.generation.num_servers))
        return self.eval_servers

    def _eval_running(self) -> bool:
        return any(not task.done() for task in self._eval_tasks)

    def _eval_servers_needed_at(self, version: int) -> bool:
        """Whether an eval will run on the eval servers with weights ``version`` (periodic, or after training)."""
        if not self.evals or not self.eval_servers:
            return False
        if version >= self.settings.number_of_steps:
            return self.settings.eval_after_training
        return any(version % e.eval_every == 0 for e in self.settings.evals)

    async def _eval_servers_to_hold(self, version: int) -> list[int]:
        """The servers that keep their weights through the push of ``version``: the eval servers mid-eval.

        When they need ``version`` for the next eval, the running one is awaited first and
        none are held, so every eval uses one set of weights, its step's.
        """
        if not self._eval_running():
            return []
        if self._eval_servers_needed_at(version):
            self.recorder.note(f"waiting for the running eval to finish before the eval servers take weights {version}")
            await self._finish_periodic_evals()
            return []
        return list(self.eval_servers)

    def _maybe_periodic_evals(self, step: int) -> None:
        if not self.evals or not self.eval_servers or step >= self.settings.number_of_steps:
            return
        due = [e for e in self.settings.evals if step % e.eval_every == 0]
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
        return {"start_step": self.start_step, **dataclasses.asdict(self.counters), **self._fault_metrics()}
