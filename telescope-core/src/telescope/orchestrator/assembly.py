"""Putting a run together from a config: environments, prompts, renderer, algorithm, recorder.

Shared by ``telescope run`` (with Ray services) and the tests (with fakes), so both
exercise the same assembly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from telescope.api.context import EnvironmentContext
from telescope.api.environment import bind_context
from telescope.inference.generation import GenerationService
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.evals import EvalRunner, reserved_eval_ids
from telescope.orchestrator.orchestrator import Orchestrator
from telescope.orchestrator.prompts import EnvironmentSlot, PromptSource
from telescope.orchestrator.run_checkpoints import RunCheckpoints
from telescope.orchestrator.services import TrainingService
from telescope.orchestrator.step_recorder import StepRecorder
from telescope.plugins.facade import Plugins
from telescope.recording.progress import StepProgress
from telescope.recording.run_store import RunStore
from telescope.schema.config import TelescopeConfig


def build_slots(config: TelescopeConfig, plugins: Plugins) -> list[EnvironmentSlot]:
    """Instantiate each training environment (with the run context) and load its dataset (eval items excluded)."""
    reserved = reserved_eval_ids(config, plugins)
    context = EnvironmentContext.from_config(config)
    slots: list[EnvironmentSlot] = []
    for index, entry in enumerate(config.environments):
        environment_class = plugins.environment(entry.name)
        try:
            environment = bind_context(environment_class(**entry.kwargs), context)
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


def build_orchestrator(
    config: TelescopeConfig,
    generation: GenerationService,
    training: TrainingService,
    *,
    plugins: Plugins,
    tokenizer: Any,
    store: RunStore,
    loggers: list[Any] | None = None,
    progress: StepProgress | None = None,
) -> Orchestrator:
    renderer = ChatRenderer(tokenizer, config.chat_template, config.enable_thinking)
    slots = build_slots(config, plugins)
    prompts = build_prompt_source(config, slots, renderer)
    recorder = StepRecorder(
        store,
        reward_ranges={s.name: (s.reward_min, s.reward_max) for s in slots},
        loggers=loggers or [],
        plugins=plugins,
        progress=progress,
    )
    evals = EvalRunner(config, plugins, renderer, generation, recorder) if config.evals else None
    return Orchestrator(
        config,
        generation,
        training,
        prompts,
        renderer,
        plugins.create_algorithm(config),
        recorder,
        RunCheckpoints(config),
        evals,
        compactor=plugins.create_compactor(config),
    )
