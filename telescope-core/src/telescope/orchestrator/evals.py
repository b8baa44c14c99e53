"""Evals: before training, every ``eval_every`` steps on dedicated servers, after training.

An eval entry names a dedicated eval (``math500``: an :class:`EvalSpec`) or any
environment. It scores the first ``num_samples`` items of its dataset (all with
-1), drawing ``pass_k.n`` completions per item (1 without ``pass_k``) at the
entry's temperature/top_p/max_tokens (inherited when null). Metrics, under
``eval/<name>/``: ``reward_mean``, ``correct_rate`` and, with ``pass_k``, the unbiased
``pass@k`` and ``pass^k``. A completion counts as correct when its sample metrics
say ``correct`` > 0, else when its reward is positive.

``separate_eval_samples``: the items an eval scores are reserved, by
``(environment name, sample_id)``, and never reach training (see
:func:`reserved_eval_ids`); keyed on the config's environment name and the
sample's stable id, never on a display name an environment can override.

Concurrency: each server has at most ``per_server_limit`` of the eval's rollouts in flight
(a rollout holds its server through all its turns, one request at a time):
``max_concurrent_prompts_per_server`` in a run, ``max_concurrent_samples_per_server`` in
``telescope eval``. Rollouts are spread over the servers round robin.

Faults: rewards and environment steps have the run's time limits; a rollout whose
server became unavailable (:class:`~telescope.inference.generation.ServerUnavailable`:
it died and is being restarted) runs again on the next of the eval's servers, a
little later, up to :data:`EVAL_SERVER_RETRIES` times.

Timeline: each eval is one ``eval.run`` event (``name``, ``phase``, ``step``, its
metrics); the events of its rollouts (requests, rewards, sandboxes) carry ``eval`` (the
name), ``eval_step`` and ``eval_phase`` (which run of it), ``sample_id`` and
``rollout_index`` (the draw). Every request of an eval at step ``s`` is served by the
weights of step ``s`` (see :mod:`telescope.orchestrator.orchestrator`), which its
``inference.request`` events' policy versions show.

pass@k and pass^k: the unbiased estimators of Chen et al. 2021 ("Evaluating Large Language
Models Trained on Code"), see :func:`pass_at_k`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Protocol

from telescope.api import events
from telescope.api.context import EnvironmentContext
from telescope.api.environment import EnvironmentBase, bind_context
from telescope.api.records import Rollout, Sample
from telescope.inference.generation import Generation, GenerationService, SamplingSettings, ServerUnavailable
from telescope.orchestrator.agent_gateway import AgentGateway, start_agent_gateway
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.episodes import EpisodeRunner
from telescope.orchestrator.group_records import request_seed
from telescope.orchestrator.settings import EvalSettings
from telescope.plugins.facade import Plugins
from telescope.plugins.registry import PluginKind
from telescope.schema.config import TelescopeConfig
from telescope.schema.entries import EvalEntry

#: Times an eval rollout whose server became unavailable (it died, it is restarting) is tried again,
#: on the next of the eval's servers, EVAL_RETRY_WAIT_S apart (a restart takes seconds to minutes).
EVAL_SERVER_RETRIES = 60
EVAL_RETRY_WAIT_S = 2.0

# ------------------------------------------------------------ pass@k / pass^k
# Unbiased pass@k and pass^k estimators (Chen et al. 2021, "Evaluating Large Language Models
# Trained on Code").
#
# For one problem with ``n`` sampled completions of which ``c`` are correct:
#
# - ``pass@k = 1 - C(n - c, k) / C(n, k)``: the probability that at least one of ``k``
#   completions drawn without replacement from the ``n`` is correct;
# - ``pass^k = C(c, k) / C(n, k)``: the probability that all ``k`` drawn completions are correct.
#
# Both are unbiased estimates of the per-problem probabilities when ``n >= k``; they are
# averaged over problems. Drawing exactly ``k`` samples and checking "any of the first k" is
# the biased, high-variance special case ``n = k``; sample ``n > k`` for tighter estimates.
#
# Computation: the binomial coefficients are exact Python integers (:func:`math.comb`) and
# their ratio is a correctly rounded float (``int / int``), so the result is exact up to
# one rounding for any ``n`` (no overflow, no cancellation; the product form of the paper is
# not needed).


def _validate(n: int, c: int, k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    if n < k:
        raise ValueError(f"pass@{k} needs at least k={k} samples per problem, but n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"the number of correct samples c={c} must be between 0 and n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` of the ``n`` samples (``c`` correct) is correct."""
    _validate(n, c, k)
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k: probability that all ``k`` of the ``n`` samples (``c`` correct) drawn are correct."""
    _validate(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def pass_k_metrics(correct_counts: Sequence[int], n: int | Sequence[int], ks: Sequence[int]) -> dict[str, float]:
    """Mean pass@k and pass^k over problems: ``{"pass@1": ..., "pass^1": ..., "pass@4": ...}``.

    ``correct_counts[i]`` is the number of correct samples of problem ``i``; ``n`` is the
    number of samples per problem, one int for all or one per problem (problems whose
    sampling partly failed). Every problem needs ``n >= max(ks)``. Raises ``ValueError``
    for no problems, no ``ks`` or invalid counts.
    """
    if not correct_counts:
        raise ValueError("pass@k needs at least one problem")
    if not ks:
        raise ValueError("pass@k needs at least one k")
    if isinstance(n, int):
        sample_counts = [n] * len(correct_counts)
    else:
        sample_counts = list(n)
        if len(sample_counts) != len(correct_counts):
            raise ValueError(
                f"got {len(correct_counts)} correct counts but {len(sample_counts)} sample counts; give one per problem"
            )
    metrics: dict[str, float] = {}
    for k in sorted(set(ks)):
        at_k = [pass_at_k(total, correct, k) for total, correct in zip(sample_counts, correct_counts, strict=True)]
        hat_k = [pass_hat_k(total, correct, k) for total, correct in zip(sample_counts, correct_counts, strict=True)]
        metrics[f"pass@{k}"] = math.fsum(at_k) / len(at_k)
        metrics[f"pass^{k}"] = math.fsum(hat_k) / len(hat_k)
    return metrics


class EvalSink(Protocol):
    def log_eval(self, name: str, step: int, metrics: dict[str, Any], **extra: Any) -> None: ...


def build_eval_environment(
    plugins: Plugins, entry: EvalEntry, context: EnvironmentContext | None = None
) -> EnvironmentBase:
    """The environment that serves an eval entry (a dedicated eval or an environment), with the run context."""
    if plugins.registry.has(PluginKind.EVAL, entry.name):
        return bind_context(plugins.eval_spec(entry.name).build(**entry.kwargs), context)
    return bind_context(plugins.environment(entry.name)(**entry.kwargs), context)


def eval_items(environment: EnvironmentBase, entry: EvalEntry) -> list[Sample]:
    samples = list(environment.load_dataset())
    return samples if entry.num_samples < 0 else samples[: entry.num_samples]


def reserved_eval_ids(config: TelescopeConfig, plugins: Plugins) -> dict[str, frozenset[str]]:
    """Sample ids that evals with ``separate_eval_samples`` reserve, per environment name."""
    training_names = {e.name for e in config.environments}
    reserved: dict[str, set[str]] = {}
    for entry in config.evals:
        if entry.separate_eval_samples and entry.name in training_names:
            environment = build_eval_environment(plugins, entry, EnvironmentContext.from_config(config))
            reserved.setdefault(entry.name, set()).update(s.sample_id for s in eval_items(environment, entry))
    return {name: frozenset(ids) for name, ids in reserved.items()}


def is_correct(rollout: Rollout) -> bool:
    reward = rollout.reward
    if reward is None or rollout.error:
        return False
    if "correct" in reward.sample_metrics:
        return reward.sample_metrics["correct"] > 0
    return reward.total_reward > 0


class EvalRunner:
    """Runs the configured evals on a set of inference servers."""

    def __init__(
        self,
        config: TelescopeConfig,
        plugins: Plugins,
        renderer: ChatRenderer,
        generation: GenerationService,
        sink: EvalSink,
        *,
        per_server_limit: int | None = None,
    ) -> None:
        self.settings = settings = EvalSettings.from_config(config)
        #: rollouts in flight on one server at most: ``max_concurrent_prompts_per_server`` in a run,
        #: ``max_concurrent_samples_per_server`` in ``telescope eval``
        self.per_server_limit = per_server_limit or settings.max_concurrent_prompts_per_server
        self.plugins = plugins
        self.renderer = renderer
        self.generation = generation
        self.sink = sink
        self._environments: dict[int, tuple[EnvironmentBase, list[Sample]]] = {}
        #: the run's agent gateway (the orchestrator sets it when it trains an agent environment);
        #: without it an eval of an agent environment starts one for its own run_all
        self.agents: AgentGateway | None = None
        #: the run's compaction (None without): an eval episode runs as a training one does
        self.compactor = plugins.create_compactor(config)

    def _environment(self, index: int, entry: EvalEntry) -> tuple[EnvironmentBase, list[Sample]]:
        if index not in self._environments:
            environment = build_eval_environment(self.plugins, entry, self.settings.environment_context)
            self._environments[index] = (environment, eval_items(environment, entry))
        return self._environments[index]

    async def run_all(
        self, *, step: int, servers: Sequence[int], phase: str, entries: Sequence[EvalEntry] | None = None
    ) -> dict[str, dict[str, float]]:
        chosen = [(i, e) for i, e in enumerate(self.settings.evals) if entries is None or e in entries]
        own = None
        if self.agents is None:
            own = self.agents = await start_agent_gateway(
                (self._environment(index, entry)[0] for index, entry in chosen),
                self.renderer.tokenizer,
                chat_template=self.settings.chat_template,
                max_model_len=self.settings.limits.max_model_len,
                model_name=self.settings.model,
            )
        try:
            return await self._run_all(chosen, step=step, servers=servers, phase=phase)
        finally:
            if own is not None:
                self.agents = None
                await own.close()

    async def _run_all(
        self, chosen: list[tuple[int, EvalEntry]], *, step: int, servers: Sequence[int], phase: str
    ) -> dict[str, dict[str, float]]:
        results: dict[str, dict[str, float]] = {}
        for index, entry in chosen:
            with (
                events.context(eval_step=step, eval_phase=phase),
                events.timed(
                    "eval.run",
                    component="orchestrator",
                    name=entry.name,
                    phase=phase,
                    step=step,
                    servers=list(servers),
                ) as event,
            ):
                metrics = await self.evaluate(index, entry, servers)
                event["metrics"] = metrics
            results[entry.name] = metrics
            self.sink.log_eval(entry.name, step, metrics, phase=phase)
        return results

    async def evaluate(self, index: int, entry: EvalEntry, servers: Sequence[int]) -> dict[str, float]:
        environment, items = self._environment(index, entry)
        n = int(entry.pass_k.get("n", 1)) if entry.pass_k else 1
        sampling = SamplingSettings(
            entry.temperature if entry.temperature is not None else self.settings.temperature,
            entry.top_p if entry.top_p is not None else self.settings.top_p,
        )
        limits = self.settings.limits
        if entry.max_tokens is not None:
            limits = dataclasses.replace(limits, max_tokens=entry.max_tokens)
        episodes = EpisodeRunner(self.renderer, limits, compactor=self.compactor, agents=self.agents)
        gates = {server: asyncio.Semaphore(max(1, self.per_server_limit)) for server in servers}

        async def one(item_index: int, sample: Sample, draw: int) -> Rollout:
            async def on(server: int) -> Rollout:
                async def generate(prompt_ids: list[int], max_tokens: int, turn: int) -> Generation:
                    seed = request_seed(self.settings.seed + 7919 * (index + 1), item_index, draw, turn)
                    return await self.generation.generate(
                        server, prompt_ids, max_tokens, seed=seed, priority=turn, sampling=sampling
                    )

                # off the loop: rendering may load a page (browser environments) or read files
                messages = await asyncio.to_thread(environment.format_prompt, sample)
                with events.context(eval=entry.name, sample_id=sample.sample_id, rollout_index=draw):
                    return await episodes.run(
                        environment,
                        sample,
                        messages,
                        self.renderer.prompt_ids(messages),
                        generate=generate,
                        policy_version=lambda: -1,
                    )

            for attempt in range(EVAL_SERVER_RETRIES + 1):  # a server that died: the next one, a bit later
                server = servers[(item_index * n + draw + attempt) % len(servers)]
                try:
                    async with gates[server]:  # at most per_server_limit rollouts in flight on each server
                        return await on(server)
                except ServerUnavailable:
                    if attempt == EVAL_SERVER_RETRIES:
                        raise
                    await asyncio.sleep(EVAL_RETRY_WAIT_S)
            raise AssertionError("unreachable")

        rollouts = await asyncio.gather(*(one(i, sample, d) for i, sample in enumerate(items) for d in range(n)))
        per_item = [rollouts[i * n : (i + 1) * n] for i in range(len(items))]
        rewards = [r.reward.total_reward if r.reward else 0.0 for r in rollouts]
        metrics: dict[str, float] = {
            f"eval/{entry.name}/reward_mean": sum(rewards) / max(len(rewards), 1),
            f"eval/{entry.name}/correct_rate": sum(is_correct(r) for r in rollouts) / max(len(rollouts), 1),
            f"eval/{entry.name}/num_items": float(len(items)),
            f"eval/{entry.name}/errors": float(sum(1 for r in rollouts if r.error)),
        }
        if entry.pass_k:
            correct_counts = [sum(is_correct(r) for r in group) for group in per_item]
            for key, value in pass_k_metrics(correct_counts, n, list(entry.pass_k["k"])).items():
                metrics[f"eval/{entry.name}/{key}"] = value
        return metrics
