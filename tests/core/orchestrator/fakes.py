"""In-process fakes for the loop: services without Ray or a model, a scripted environment.

The fake inference server "generates" tokens from a seeded RNG (so a request's
output depends only on its seed), can be slowed down (all servers, or some), and records
every request (with the weights version of the server that served it and the event
context's ids), cancellation and weight push; each server holds its own version (a held
server keeps its weights through a push); the fake trainer records every batch.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from telescope.api import events
from telescope.api.environment import BaseEnvironment
from telescope.api.records import RewardResult, Sample, SupervisedExample, TrainingBatch
from telescope.config.loader import load_config
from telescope.inference.generation import Generation, GenerationService, SamplingSettings
from telescope.orchestrator.services import TrainingService
from telescope.plugins.facade import Plugins
from telescope.plugins.manager import TelescopePluginManager
from telescope.plugins.registry import Registry
from telescope.schema.config import TelescopeConfig
from telescope.trainer import checkpoint as trainer_ckpt


class ParityEnvironment(BaseEnvironment):
    """Reward 1 when the completion has an even number of characters, else 0 (varied rewards)."""

    name = "parity"

    def __init__(self, size: int = 40, fail_on: str | None = None, demonstrations: bool = False) -> None:
        self.size = size
        self.fail_on = fail_on
        self.demonstrations = demonstrations

    def demonstration(self, sample: Sample) -> str | None:
        """With ``demonstrations``: a two-character answer (even: rewarded), for a warm start."""
        return "ok" if self.demonstrations else None

    def load_dataset(self) -> list[Sample]:
        return [Sample(prompt=f"question {i}", answer=i, sample_id=f"q{i}") for i in range(self.size)]

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        if self.fail_on is not None and sample.sample_id == self.fail_on:
            raise RuntimeError("reward function exploded")
        even = float(len(completion) % 2 == 0)
        return RewardResult(total_reward=even, sample_metrics={"length": float(len(completion)), "correct": even})


@dataclass
class FakeServices(GenerationService, TrainingService):
    """Services over a fake engine and a fake trainer."""

    servers: int = 2
    delay_s: float = 0.0
    vocab: list[int] = field(default_factory=lambda: list(range(30, 120)))
    eos_token_id: int = 2
    version: int = 0
    #: extra seconds per request on these servers (a slow eval server)
    server_delay_s: dict[int, float] = field(default_factory=dict)
    #: the weights version each server holds (the latest push unless it was held)
    server_versions: dict[int, int] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    cancelled: int = 0
    batches: list[TrainingBatch] = field(default_factory=list)
    supervised: list[list[SupervisedExample]] = field(default_factory=list)
    pushed: list[int] = field(default_factory=list)
    #: (version, held servers) of every push
    pushes: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    checkpoint_root: Path | None = None
    trained_step: int = 0
    #: seconds wait_ready() takes (a trainer still setting up), and what it raises then (None: nothing)
    trainer_start_s: float = 0.0
    trainer_start_error: Exception | None = None
    #: requests made before wait_ready() returned
    requests_before_ready: int | None = None
    #: requests in flight on each server now, and the most there were at once
    in_flight: Counter[int] = field(default_factory=Counter)
    peak_in_flight: Counter[int] = field(default_factory=Counter)

    @property
    def num_servers(self) -> int:
        return self.servers

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
        version = self.server_versions.get(server, self.version)
        record = {"server": server, "seed": seed, "version": version, "priority": priority, **events.current_context()}
        self.requests.append(record)
        self.in_flight[server] += 1
        self.peak_in_flight[server] = max(self.peak_in_flight[server], self.in_flight[server])
        try:
            if self.delay_s or self.server_delay_s.get(server):
                await asyncio.sleep(self.delay_s + self.server_delay_s.get(server, 0.0))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight[server] -= 1
        end_version = record["end_version"] = self.server_versions.get(server, self.version)
        rng = random.Random(seed)
        length = rng.randint(1, max(1, min(max_tokens, 8)) - 1) if max_tokens > 1 else 0
        tokens = [rng.choice(self.vocab) for _ in range(length)] + [self.eos_token_id]
        return Generation(tokens, [-1.0] * len(tokens), "stop", version, end_version)

    async def wait_ready(self) -> None:
        await asyncio.sleep(self.trainer_start_s)
        self.requests_before_ready = len(self.requests)
        if self.trainer_start_error is not None:
            raise self.trainer_start_error

    async def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        self.batches.append(batch)
        self.trained_step = batch.step + 1
        return {"loss": 0.0, "grad_norm": 1.0, "learning_rate": 1e-6}

    async def supervised_step(self, examples: list[SupervisedExample], learning_rate: float) -> dict[str, float]:
        self.supervised.append(list(examples))
        return {"loss": 1.0 / len(self.supervised), "grad_norm": 1.0}

    async def push_weights(self, version: int, *, held_servers: Sequence[int] = ()) -> dict[str, float]:
        self.version = version
        self.pushed.append(version)
        self.pushes.append((version, tuple(held_servers)))
        for server in range(self.servers):
            if server not in held_servers:
                self.server_versions[server] = version
        return {"timing_weight_sync_trainer_total": 0.0, "timing_weight_sync_inference_total": 0.0}

    async def save_checkpoint(self, step: int) -> None:
        assert self.checkpoint_root is not None
        manager = trainer_ckpt.TrainerCheckpoints(self.checkpoint_root, every=1)
        manager.save(_FakeBackend(step), step)

    async def load_checkpoint(self, path: Path) -> dict[str, Any]:
        meta: dict[str, Any] = json.loads((path / trainer_ckpt.META).read_text())
        self.trained_step = int(meta["step"])
        return meta


class _FakeBackend:
    def __init__(self, step: int) -> None:
        self.step = step

    def save_checkpoint(self, path: Path, *, training_state: bool = True) -> None:
        path.mkdir(parents=True, exist_ok=True)
        (path / trainer_ckpt.META).write_text(json.dumps({"step": self.step}))


def loop_config(tmp_path: Path, **overrides: Any) -> TelescopeConfig:
    values: dict[str, Any] = {
        "environments": [{"name": "parity"}],
        "group_size": 4,
        "prompts_batch_size_for_trainer": 3,
        "number_of_steps": 4,
        "max_tokens": 16,
        "max_model_len": 128,
        "seq_len": 128,
        "pad_to_multiple_of": 16,
        "max_async_rollout": 0,
        "inference_num_workers": 2,
        "max_concurrent_prompts_per_server": 8,
        "use_wandb": False,
        "eval_before_training": False,
        "eval_after_training": False,
        "run_dir": str(tmp_path / "run"),
        "seed": 3,
    }
    values.update(overrides)
    return load_config(None, values, check_plugins=False).config


def plugins_for(registry: Registry) -> Plugins:
    """The typed facade over a hand-made registry (no entry points loaded)."""
    return Plugins(TelescopePluginManager(builtins=(), load_entry_points=False), registry)
