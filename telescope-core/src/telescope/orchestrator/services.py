"""What the training driver needs from the workers, as one small interface.

The driver (:mod:`telescope.orchestrator.orchestrator`) is written against :class:`Services`:
generate a completion on inference server ``i``, take a training step, push new
weights to every server, save and load checkpoints. :mod:`telescope.runtime.ray_services`
implements it with Ray actors (trainer ranks, inference servers); tests implement it
with in-process fakes, so the orchestration logic is tested without Ray or a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from telescope.api.records import FinishReason, TrainingBatch
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
        completion.policy_version_start, completion.policy_version_end,
    )  # fmt: skip


class Services(Protocol):
    """The workers behind a run."""

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

    async def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        """One trainer step on every rank; returns the rank-averaged step metrics."""
        ...

    async def push_weights(self, version: int) -> dict[str, float]:
        """Send the trainer's weights to every server as ``version``; returns timings."""
        ...

    async def save_checkpoint(self, step: int) -> None:
        """Every trainer rank saves checkpoint ``step`` (atomic; ``latest``; retention)."""
        ...

    async def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Every trainer rank restores the checkpoint folder ``path``."""
        ...

    async def close(self) -> None: ...
