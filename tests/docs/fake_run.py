"""``launch_run`` for real, in this process, with fake workers in place of Ray.

Two things are replaced: ``connect_ray`` (no cluster is started) and ``RayServices``
(the trainer ranks and inference servers), by :class:`FakeWorkers`, which "generates"
seeded tokens and "trains" by returning fixed metrics. Everything else is what
``telescope run`` executes: the run directory and store, the loggers, the lifecycle
hooks, the orchestrator, the step recorder and the status file. Two steps take a few
seconds (the tiny model's tokenizer; no model is run).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from telescope import hookimpl
from telescope.api import BaseEnvironment, RewardResult, Sample
from telescope.api.records import SupervisedExample, TrainingBatch
from telescope.inference.generation import Generation, GenerationService, SamplingSettings
from telescope.orchestrator.services import TrainingService
from telescope.plugins.registry import Registrar
from telescope.recording.infra_monitor import InfraMonitor

#: A small, fast run over the fake workers (tokens 30..119 exist in the tiny tokenizer).
RUN_ARGS: list[str] = [
    "--model",
    "tiny:test",
    "--environments",
    "[{name: length_parity}]",
    "--algorithm",
    "grpo",
    "--number_of_steps",
    "2",
    "--group_size",
    "2",
    "--prompts_batch_size_for_trainer",
    "2",
    "--max_tokens",
    "8",
    "--max_model_len",
    "128",
    "--seq_len",
    "128",
    "--pad_to_multiple_of",
    "16",
    "--inference_num_workers",
    "1",
    "--max_async_rollout",
    "0",
    "--discard_group_zero_advantage",
    "false",
    "--eval_before_training",
    "false",
    "--eval_after_training",
    "false",
    "--use_wandb",
    "false",
]


class LengthParity(BaseEnvironment):
    """Reward 1 for a completion of even length: varied rewards without a model."""

    name = "length_parity"

    def load_dataset(self) -> list[Sample]:
        return [Sample(prompt=f"question {i}", answer=i, sample_id=f"q{i}") for i in range(16)]

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return RewardResult(total_reward=float(len(completion) % 2 == 0))


class FakeRunPlugin:
    """Registers the environment the fake run trains on."""

    @hookimpl
    def telescope_register_environments(self, register: Registrar) -> None:
        register("length_parity", LengthParity)


class FakeWorkers(GenerationService, TrainingService):
    """Stands in for ``RayServices``: the same constructor and methods, no processes."""

    #: The training step whose ``train_step`` raises (None: none does).
    fail_at_step: ClassVar[int | None] = None

    def __init__(self, config: Any, run_dir: Path) -> None:
        self.version = 0
        self.generation = self  # the run's generation handle (RayServices.generation): here the same object

    @property
    def num_servers(self) -> int:
        return 1

    def start(self) -> None:
        pass

    def infra_monitor(self) -> InfraMonitor:
        """No workers, nothing to sample: a monitor with no collectors."""
        return InfraMonitor([])

    def start_trainers(self, on_fatal: Any, started: float) -> None:
        pass

    async def wait_ready(self) -> None:
        pass

    async def close(self) -> None:
        pass

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
        rng = random.Random(seed)
        tokens = [rng.randrange(30, 120) for _ in range(rng.randint(1, max(1, max_tokens - 1)))]
        return Generation(tokens, [-1.0] * len(tokens), "stop", self.version, self.version)

    async def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        if batch.step == self.fail_at_step:
            raise RuntimeError(f"the fake trainer fails at step {batch.step}")
        return {"loss": 0.5, "grad_norm": 1.0, "learning_rate": 1e-6}

    async def supervised_step(self, examples: list[SupervisedExample], learning_rate: float) -> dict[str, float]:
        return {"loss": 1.0, "grad_norm": 1.0}

    async def push_weights(self, version: int, *, held_servers: Sequence[int] = ()) -> dict[str, float]:
        self.version = version
        return {}

    async def save_checkpoint(self, step: int) -> None:
        pass

    async def load_checkpoint(self, path: Path) -> dict[str, Any]:
        return {}


def run_with_fake_workers(
    monkeypatch: pytest.MonkeyPatch, run_dir: Path, plugins: dict[str, object], args: Sequence[str] = ()
) -> int:
    """Load a config as ``telescope run`` does and run it; returns launch_run's exit code.

    ``plugins`` (name -> plugin object) are registered on the process's plugin manager
    next to whatever is installed.
    """
    from telescope.config import load_config
    from telescope.plugins.manager import get_plugin_manager
    from telescope.runtime import ray_cluster, ray_services
    from telescope.runtime.launch import launch_run

    manager = get_plugin_manager()
    for name, plugin in {"fake-run": FakeRunPlugin(), **plugins}.items():
        manager.register_plugin(plugin, name)
    monkeypatch.setattr(ray_services, "RayServices", FakeWorkers)
    monkeypatch.setattr(ray_cluster, "connect_ray", lambda config, run_dir: False)
    loaded = load_config(None, [*RUN_ARGS, "--run_dir", str(run_dir), *args])
    return launch_run(loaded)
