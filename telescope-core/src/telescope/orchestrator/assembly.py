"""Putting a run together from a config: environments, prompts, renderer, algorithm, recorder.

Shared by ``telescope run`` (with Ray services) and the tests (with fakes), so both
exercise the same assembly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from telescope.config.schema import TelescopeConfig
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.evals import EvalRunner, reserved_eval_ids
from telescope.orchestrator.orchestrator import TrainingRun
from telescope.orchestrator.prompts import EnvironmentSlot, PromptSource
from telescope.orchestrator.run_checkpoints import CheckpointManager
from telescope.orchestrator.services import Services
from telescope.plugins.registry import PluginKind, Registry
from telescope.recording.progress import StepProgress
from telescope.recording.recorder import StepRecorder
from telescope.recording.run_store import RunStore


def build_slots(config: TelescopeConfig, registry: Registry) -> list[EnvironmentSlot]:
    """Instantiate each training environment and load its dataset (eval items excluded)."""
    reserved = reserved_eval_ids(config, registry)
    slots: list[EnvironmentSlot] = []
    for index, entry in enumerate(config.environments):
        environment_class = registry.get(PluginKind.ENVIRONMENT, entry.name)
        try:
            environment = environment_class(**entry.kwargs)
        except TypeError as exc:
            raise ValueError(f"environments[{index}] ({entry.name}): bad kwargs {entry.kwargs}: {exc}") from exc
        samples = [
            s if s.environment else dataclasses.replace(s, environment=entry.name) for s in environment.load_dataset()
        ]
        slots.append(
            EnvironmentSlot(
                index=index,
                name=entry.name,
                environment=environment,
                samples=samples,
                weight=entry.weight,
                reward_min=entry.reward_min,
                reward_max=entry.reward_max,
                excluded_ids=reserved.get(entry.name, frozenset()),
            )
        )
    return slots


def build_prompt_source(config: TelescopeConfig, slots: list[EnvironmentSlot], renderer: ChatRenderer) -> PromptSource:
    def render(slot: EnvironmentSlot, sample: Any) -> tuple[list[dict[str, Any]], list[int]]:
        messages = slot.environment.format_prompt(sample)
        return messages, renderer.prompt_ids(messages)

    return PromptSource(
        slots,
        render,
        seed=config.seed,
        prefetch=config.enable_prompt_prefetch,
        prefetch_size=config.prompt_prefetch_buffer_size,
    )


def build_training_run(
    config: TelescopeConfig,
    services: Services,
    *,
    registry: Registry,
    tokenizer: Any,
    store: RunStore,
    loggers: list[Any] | None = None,
    hook: Any = None,
    progress: StepProgress | None = None,
) -> TrainingRun:
    from telescope.algorithms.factory import build_algorithm

    renderer = ChatRenderer(tokenizer, config.chat_template, config.enable_thinking)
    slots = build_slots(config, registry)
    prompts = build_prompt_source(config, slots, renderer)
    recorder = StepRecorder(
        store,
        reward_ranges={s.name: (s.reward_min, s.reward_max) for s in slots},
        loggers=loggers or [],
        hook=hook,
        progress=progress,
    )
    evals = EvalRunner(config, registry, renderer, services, recorder) if config.evals else None
    return TrainingRun(
        config,
        services,
        prompts,
        renderer,
        build_algorithm(config),
        recorder,
        CheckpointManager(config),
        evals,
    )
