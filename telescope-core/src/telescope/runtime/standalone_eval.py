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
from telescope.orchestrator.services import ServerPool


class EvalServers:
    """The configured backend's inference servers, started without Ray or a trainer, and their pool."""

    def __init__(self, config: TelescopeConfig, run_dir: Path) -> None:
        from telescope.inference.client import InferenceClient
        from telescope.plugins.facade import get_plugins

        name = config.inference_backend
        if name == "auto":
            from telescope.inference import default_backend_name

            name = default_backend_name()
        backend = get_plugins().create_inference_backend(name, config)
        count = max(1, config.inference_num_workers // config.inference_tensor_parallel_size)
        self.servers = [backend.start_server(i, run_dir) for i in range(count)]
        clients = [
            InferenceClient(s.address.base_url, server_index=i, read_timeout=config.inference_request_timeout_s)
            for i, s in enumerate(self.servers)
        ]
        self.generation = ServerPool(clients, config.vllm_scheduling_policy)

    async def close(self) -> None:
        await self.generation.aclose()
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
    services = EvalServers(config, output)
    store = RunStore(output)
    try:
        renderer = ChatRenderer(
            AutoTokenizer.from_pretrained(config.model), config.chat_template, config.enable_thinking
        )
        runner = EvalRunner(config, get_plugins(), renderer, services.generation, store)
        servers = list(range(services.generation.num_servers))
        return asyncio.run(runner.run_all(step=0, servers=servers, phase="standalone"))
    finally:
        asyncio.run(services.close())
        store.close()
