"""A short, real, deterministic training run in this process: the reference trajectory's run.

What runs is the loop of ``telescope run`` without Ray: the real
:class:`~telescope.orchestrator.orchestrator.Orchestrator` (prompt sampling, rollouts,
rewards, the algorithm's advantages, batch assembly, the step recorder and the run
store) over :class:`InProcessServices`, which hold a real embedded inference
:class:`~telescope.inference.embedded.engine.Engine` and the real ``fsdp`` trainer
backend (one rank on the CPU: the plain module), and push the trainer's weights into
the engine after every step, as the ``memory`` transport does between processes.

Determinism. The run is synchronous (``max_async_rollout: 0``) with
``batch_assembly: deterministic`` and a fixed ``seed``; every completion is generated
alone (one request at a time, so no batch composition or timing can change a logit),
each with its own seeded sampler; torch runs on one thread (the reduction order of a
matrix product depends on the thread count). What is left is the CPU's kernels: another
CPU or another torch build may round differently, which the test's tolerance absorbs
up to a point (see ``test_trajectory.py``).

Limits: no Ray, no HTTP, no separate processes, no weight transport: those are
exercised by the end-to-end tests, not here. Checkpoints are not written
(``checkpoint_every: 0``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from telescope import hookimpl
from telescope.api import BaseEnvironment, RewardResult, Sample
from telescope.api.records import SupervisedExample, TrainingBatch
from telescope.inference.generation import Generation, GenerationService, SamplingSettings
from telescope.orchestrator.services import TrainingService
from telescope.plugins.facade import Plugins
from telescope.plugins.registry import Registrar
from telescope.schema.config import TelescopeConfig

#: The run: 10-20 s on one core, long enough for the weights and the sampled completions to move.
REFERENCE_ARGS: dict[str, Any] = {
    "model": "tiny:test",
    "model_dtype": "float32",
    "mixed_precision_dtype": None,
    "gradient_checkpointing": False,
    "environments": [{"name": "reference_parity"}],
    "algorithm": "grpo",
    "seed": 0,
    "number_of_steps": 6,
    "group_size": 4,
    "prompts_batch_size_for_trainer": 4,
    "max_tokens": 16,
    "max_model_len": 128,
    "seq_len": 256,
    "pad_to_multiple_of": 16,
    "learning_rate": 3e-3,
    "number_of_minibatches": 2,
    "use_ppo_clip": True,
    "clip_low": 0.2,
    "clip_high": 0.2,
    "lr_scheduler": "constant",
    "temperature": 1.0,
    "max_async_rollout": 0,
    "batch_assembly": "deterministic",
    "discard_group_zero_advantage": False,
    "inference_num_workers": 1,
    "trainer_num_workers": 1,
    "inference_backend": "embedded",
    "weight_transport": "memory",
    "eval_before_training": False,
    "eval_after_training": False,
    "use_wandb": False,
}


class ReferenceParity(BaseEnvironment):
    """Reward 1 when the completion's text has an even number of characters: varied rewards from any model."""

    name = "reference_parity"

    def load_dataset(self) -> list[Sample]:
        return [Sample(prompt=f"question {i}", answer=i, sample_id=f"q{i}") for i in range(32)]

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        even = float(len(completion) % 2 == 0)
        return RewardResult(total_reward=even, sample_metrics={"length": float(len(completion))})


class ReferencePlugin:
    """Registers the reference run's environment."""

    @hookimpl
    def telescope_register_environments(self, register: Registrar) -> None:
        register("reference_parity", ReferenceParity)


class InProcessServices(GenerationService, TrainingService):
    """The generation and training handles over an engine and a trainer backend in this process."""

    num_servers = 1

    def __init__(self, config: TelescopeConfig, plugins: Plugins, model_path: str) -> None:
        from telescope.inference.embedded.engine import Engine
        from telescope.inference.embedded.records import EngineSettings

        self.backend = plugins.create_trainer_backend(config, plugins.create_algorithm(config))
        self.backend.setup(device="cpu")
        settings = EngineSettings(
            model_path=model_path,
            dtype=config.model_dtype,
            max_num_seqs=1,
            max_model_len=config.max_model_len,
            seed=config.seed,
        )
        self.engine = Engine(settings).start()
        self._one_at_a_time = asyncio.Lock()

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
        from telescope.inference.embedded.records import GenerationParams

        params = GenerationParams(
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_p=1.0 if sampling.top_p is None else sampling.top_p,
            seed=seed,
        )
        async with self._one_at_a_time:
            result = await asyncio.to_thread(self.engine.generate, prompt_ids, params)
        sequence = result.sequences[0]
        versions = sequence.token_policy_versions
        return Generation(
            sequence.token_ids,
            sequence.logprobs,
            "length" if sequence.finish_reason == "length" else "stop",
            versions[0] if versions else self.engine.policy_version,
            versions[-1] if versions else self.engine.policy_version,
            versions,
        )

    async def wait_ready(self) -> None:
        return None

    async def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        return self.backend.train_step(batch)

    async def supervised_step(self, examples: list[SupervisedExample], learning_rate: float) -> dict[str, float]:
        return self.backend.supervised_step(examples, learning_rate)

    async def push_weights(self, version: int, *, held_servers: Sequence[int] = ()) -> dict[str, float]:
        if 0 not in held_servers:
            self.engine.update_weights(self.backend.named_weights(), version)
        return {}

    async def save_checkpoint(self, step: int) -> None:
        raise NotImplementedError("the reference run writes no checkpoints (checkpoint_every: 0)")

    async def load_checkpoint(self, path: Path) -> dict[str, Any]:
        raise NotImplementedError("the reference run resumes from no checkpoint")

    def close(self) -> None:
        self.engine.stop()
        self.backend.close()


def run_reference(run_dir: Path) -> list[dict[str, Any]]:
    """Run the reference config into ``run_dir``; returns its ``metrics.jsonl`` records, one per step."""
    import torch
    from transformers import AutoTokenizer

    from telescope.config.loader import load_config
    from telescope.models.tiny import resolve_model_path
    from telescope.orchestrator.assembly import build_orchestrator
    from telescope.plugins.facade import get_plugins
    from telescope.plugins.manager import TelescopePluginManager, get_plugin_manager, reset_plugin_manager
    from telescope.recording.run_store import RunStore

    previous = get_plugin_manager()
    manager = TelescopePluginManager()  # the installed plugins and the reference environment, for this run only
    manager.register_plugin(ReferencePlugin(), "reference-run")
    reset_plugin_manager(manager)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        config = load_config(None, {**REFERENCE_ARGS, "run_dir": str(run_dir)}).config
        plugins = get_plugins()
        model_path = str(resolve_model_path(config.model))
        services = InProcessServices(config, plugins, model_path)
        store = RunStore(run_dir)
        run = build_orchestrator(
            config,
            services,
            services,
            plugins=plugins,
            tokenizer=AutoTokenizer.from_pretrained(model_path),
            store=store,
        )
        try:
            asyncio.run(run.run())
        finally:
            run.prompts.close()
            store.close()
            services.close()
    finally:
        torch.set_num_threads(threads)
        reset_plugin_manager(previous)
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]
