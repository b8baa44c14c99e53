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
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from telescope.api.environment import EnvironmentBase
from telescope.api.evals import EvalSpec
from telescope.api.records import Rollout, Sample
from telescope.config.entries import EvalEntry
from telescope.config.schema import TelescopeConfig
from telescope.loop.services import SamplingSettings, Services
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.rollout import Generation, RolloutLimits, run_rollout
from telescope.orchestrator.scheduler import request_seed
from telescope.plugins.registry import PluginKind, Registry


class EvalSink(Protocol):
    def log_eval(self, name: str, step: int, metrics: dict[str, Any], **extra: Any) -> None: ...


def build_eval_environment(registry: Registry, entry: EvalEntry) -> EnvironmentBase:
    """The environment that serves an eval entry (a dedicated eval or an environment)."""
    if registry.has(PluginKind.EVAL, entry.name):
        spec = registry.get(PluginKind.EVAL, entry.name)
        if not isinstance(spec, EvalSpec):
            raise TypeError(f"eval {entry.name!r} is registered as {type(spec).__name__}, not an EvalSpec")
        return spec.build(**entry.kwargs)
    environment_class = registry.get(PluginKind.ENVIRONMENT, entry.name)
    environment: EnvironmentBase = environment_class(**entry.kwargs)
    return environment


def eval_items(environment: EnvironmentBase, entry: EvalEntry) -> list[Sample]:
    samples = list(environment.load_dataset())
    return samples if entry.num_samples < 0 else samples[: entry.num_samples]


def reserved_eval_ids(config: TelescopeConfig, registry: Registry) -> dict[str, frozenset[str]]:
    """Sample ids that evals with ``separate_eval_samples`` reserve, per environment name."""
    training_names = {e.name for e in config.environments}
    reserved: dict[str, set[str]] = {}
    for entry in config.evals:
        if entry.separate_eval_samples and entry.name in training_names:
            environment = build_eval_environment(registry, entry)
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
        registry: Registry,
        renderer: ChatRenderer,
        services: Services,
        sink: EvalSink,
    ) -> None:
        self.config = config
        self.registry = registry
        self.renderer = renderer
        self.services = services
        self.sink = sink
        self._environments: dict[int, tuple[EnvironmentBase, list[Sample]]] = {}

    def _environment(self, index: int, entry: EvalEntry) -> tuple[EnvironmentBase, list[Sample]]:
        if index not in self._environments:
            environment = build_eval_environment(self.registry, entry)
            self._environments[index] = (environment, eval_items(environment, entry))
        return self._environments[index]

    async def run_all(
        self, *, step: int, servers: Sequence[int], phase: str, entries: Sequence[EvalEntry] | None = None
    ) -> dict[str, dict[str, float]]:
        results: dict[str, dict[str, float]] = {}
        for index, entry in enumerate(self.config.evals):
            if entries is not None and entry not in entries:
                continue
            metrics = await self.evaluate(index, entry, servers)
            results[entry.name] = metrics
            self.sink.log_eval(entry.name, step, metrics, phase=phase)
        return results

    async def evaluate(self, index: int, entry: EvalEntry, servers: Sequence[int]) -> dict[str, float]:
        from telescope.evals.passk import pass_k_metrics

        environment, items = self._environment(index, entry)
        n = int(entry.pass_k.get("n", 1)) if entry.pass_k else 1
        sampling = SamplingSettings(
            entry.temperature if entry.temperature is not None else self.config.temperature,
            entry.top_p if entry.top_p is not None else self.config.top_p,
        )
        limits = RolloutLimits(
            entry.max_tokens if entry.max_tokens is not None else self.config.max_tokens,
            self.config.max_model_len,
            self.config.interleaved_rollouts,
        )
        capacity = max(1, len(servers) * self.config.max_concurrent_prompts_per_server)
        gate = asyncio.Semaphore(capacity)

        async def one(item_index: int, sample: Sample, draw: int) -> Rollout:
            server = servers[(item_index * n + draw) % len(servers)]

            async def generate(prompt_ids: list[int], max_tokens: int, turn: int) -> Generation:
                seed = request_seed(self.config.seed + 7919 * (index + 1), item_index, draw, turn)
                return await self.services.generate(
                    server, prompt_ids, max_tokens, seed=seed, priority=turn, sampling=sampling
                )

            async with gate:
                messages = environment.format_prompt(sample)
                return await run_rollout(
                    environment, sample, messages, self.renderer.prompt_ids(messages),
                    renderer=self.renderer, generate=generate, policy_version=lambda: -1, limits=limits,
                )  # fmt: skip

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
