"""``telescope eval``: the run's evals on a saved checkpoint, without a trainer.

Starts the configured inference backend's servers directly (no Ray, no trainer),
with the checkpoint's weights (a checkpoint folder is a Hugging Face folder), and
runs every entry of ``evals`` through the same :class:`~telescope.orchestrator.evals.EvalRunner`
as a training run, so the numbers are comparable. Results go to
``<output>/evals.jsonl`` and are printed.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from telescope.config.schema import TelescopeConfig
from telescope.orchestrator.rollouts import Generation
from telescope.orchestrator.services import SamplingSettings, complete_on


class EvalOnlyServices:
    """Inference servers only: a :class:`~telescope.orchestrator.services.GenerationService`."""

    def __init__(self, config: TelescopeConfig, run_dir: Path) -> None:
        from telescope.plugins.facade import get_plugins

        name = config.inference_backend
        if name == "auto":
            from telescope.inference import default_backend_name

            name = default_backend_name()
        backend = get_plugins().create_inference_backend(name, config)
        self.scheduling_policy = config.vllm_scheduling_policy
        count = max(1, config.inference_num_workers // config.inference_tensor_parallel_size)
        self.servers = [backend.start_server(i, run_dir) for i in range(count)]
        from telescope.inference.client import InferenceClient

        self.clients = [InferenceClient(s.address.base_url) for s in self.servers]

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

    async def close(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                await client.aclose()
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.stop()


def resolve_checkpoint_model(path: Path) -> Path:
    """A checkpoint folder, a checkpoints root (its latest) or a run directory (its latest)."""
    from telescope.trainer.checkpoint import resolve_checkpoint

    for candidate in (path, path / "checkpoints"):
        with contextlib.suppress(FileNotFoundError):
            return resolve_checkpoint(candidate)
    has_weights = any(path.glob("*.safetensors")) or (path / "pytorch_model.bin").exists()
    if (path / "config.json").exists() and has_weights:
        return path  # a plain Hugging Face folder
    raise FileNotFoundError(
        f"no checkpoint at {path}: expected a checkpoint folder (step_XXXXXXXX), a checkpoints folder or a run "
        "directory with checkpoints (checkpoint_every > 0), or a Hugging Face model folder"
    )


def run_evals(config: TelescopeConfig, checkpoint: Path, output: Path) -> dict[str, dict[str, float]]:
    """Evaluate ``checkpoint`` with ``config.evals``; returns {eval name: metrics}."""
    from transformers import AutoTokenizer

    from telescope.orchestrator.chat import ChatRenderer
    from telescope.orchestrator.evals import EvalRunner
    from telescope.plugins.facade import get_plugins
    from telescope.recording.run_store import RunStore

    if not config.evals:
        raise ValueError("the config has no evals; add an `evals:` list (or pass --evals '[{name: ...}]')")
    config = config.model_copy(deep=True)
    config.model = str(resolve_checkpoint_model(checkpoint))
    output.mkdir(parents=True, exist_ok=True)
    services = EvalOnlyServices(config, output)
    store = RunStore(output)
    try:
        renderer = ChatRenderer(
            AutoTokenizer.from_pretrained(config.model), config.chat_template, config.enable_thinking
        )
        runner = EvalRunner(config, get_plugins(), renderer, services, store)
        servers = list(range(services.num_servers))
        return asyncio.run(runner.run_all(step=0, servers=servers, phase="standalone"))
    finally:
        asyncio.run(services.close())
        store.close()
