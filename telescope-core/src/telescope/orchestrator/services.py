"""What the orchestrator needs from the workers, as two small handles.

The orchestrator (:mod:`telescope.orchestrator.orchestrator`) is written against
:class:`GenerationService` (generate a completion on inference server ``i``) and
:class:`TrainingService` (a training step, a supervised step, push new weights to
every server, save and load checkpoints). :mod:`telescope.runtime.ray_services`
implements both with Ray actors (trainer ranks, inference servers);
``telescope eval`` implements only generation (:mod:`telescope.runtime.standalone_eval`);
tests implement them with in-process fakes, so the orchestration logic is tested
without Ray or a model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from telescope.api.records import FinishReason, SupervisedExample, TrainingBatch
from telescope.orchestrator.rollouts import Generation


@dataclass(frozen=True)
class SamplingSettings:
    """Per-request sampling parameters (training, or an eval's overrides)."""

    temperature: float
    top_p: float | None


async def complete_on(
    client: Any,
    prompt_ids: list[int],
    max_tokens: int,
    *,
    seed: int,
    priority: int,
    sampling: SamplingSettings,
    scheduling_policy: str,
) -> Generation:
    """One completion through an :class:`~telescope.inference.client.InferenceClient`, as a Generation.

    ``priority`` is sent only under the ``priority`` scheduling policy (``fcfs`` ignores it).
    """
    result = await client.complete(
        prompt_ids, max_tokens=max_tokens, temperature=sampling.temperature, top_p=sampling.top_p, seed=seed,
        priority=priority if scheduling_policy == "priority" else 0,
    )  # fmt: skip
    completion = result.completions[0]
    finish: FinishReason = "length" if completion.finish_reason == "length" else "stop"
    return Generation(
        completion.token_ids, completion.logprobs, finish,
        completion.policy_version_start, completion.policy_version_end, completion.token_policy_versions,
    )  # fmt: skip


class ServerPool:
    """The :class:`GenerationService` over one inference client per server (what a run and ``telescope eval`` use)."""

    def __init__(self, clients: list[Any], scheduling_policy: str) -> None:
        self.clients = clients
        self.scheduling_policy = scheduling_policy

    @property
    def num_servers(self) -> int:
        return len(self.clients)

    async def generate(
        self, server: int, prompt_ids: list[int], max_tokens: int, *, seed: int, priority: int,
        sampling: SamplingSettings,
    ) -> Generation:  # fmt: skip
        return await complete_on(
            self.clients[server], prompt_ids, max_tokens, seed=seed, priority=priority, sampling=sampling,
            scheduling_policy=self.scheduling_policy,
        )  # fmt: skip

    async def aclose(self) -> None:
        """Close every client's connections (the servers keep running)."""
        for client in self.clients:
            with contextlib.suppress(Exception):
                await client.aclose()
        self.clients = []


class GenerationService(Protocol):
    """The inference servers behind a run (or behind ``telescope eval``)."""

    @property
    def num_servers(self) -> int: ...

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
        """One completion of ``prompt_ids`` on server ``server``; cancelling aborts it."""
        ...


class TrainingService(Protocol):
    """The trainer ranks behind a run, and the weight path from them to the servers."""

    async def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        """One trainer step on every rank; returns the rank-averaged step metrics."""
        ...

    async def supervised_step(self, examples: list[SupervisedExample], learning_rate: float) -> dict[str, float]:
        """One supervised (cross-entropy) step on demonstrations, on every rank (the warm start)."""
        ...

    async def push_weights(self, version: int, *, held_servers: Sequence[int] = ()) -> dict[str, float]:
        """Send the trainer's weights to every server as ``version``; returns timings.

        Servers in ``held_servers`` take part in the transfer but keep the weights they
        have (an eval server while its eval runs: one set of weights per eval).
        """
        ...

    async def save_checkpoint(self, step: int) -> None:
        """Every trainer rank saves checkpoint ``step`` (atomic; ``latest``; retention)."""
        ...

    async def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Every trainer rank restores the checkpoint folder ``path``."""
        ...
