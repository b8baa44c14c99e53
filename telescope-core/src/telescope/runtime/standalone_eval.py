"""``telescope eval``: the config's evals on saved checkpoints, without a trainer.

For each checkpoint, in step order (:mod:`telescope.runtime.eval_checkpoints` says
which): start the configured inference backend's servers directly (no Ray, no trainer)
on the checkpoint's folder, run every entry of ``evals`` through the same
:class:`~telescope.orchestrator.evals.EvalRunner` as a training run (so the numbers are
comparable), stop the servers. Results, keyed by the checkpoint's step:

- returned as ``{step: {eval name: metrics}}`` and handed to ``on_result`` as each
  checkpoint finishes (the command prints them);
- appended to ``<output>/evals.jsonl`` (run store format: ``name``, ``step``,
  ``phase: "standalone"``, ``checkpoint``, ``metrics``), with the timeline events of
  the rollouts under ``<output>/events/``;
- with ``wandb_run_path``, logged into that W&B run (:mod:`telescope.runtime.eval_wandb`).

Serving: ``inference_num_workers / inference_tensor_parallel_size`` servers of
``inference_backend``; at most ``max_concurrent_samples_per_server`` rollouts in flight
on each, and the servers are sized to it (the server batch, vLLM's ``--max-num-seqs``,
is that bound when ``max_num_seqs`` is null). The ``ray_*`` fields of an eval config are
accepted (they are run fields) and unused here: the servers are local processes, on
loopback unless ``inference_host`` names another address, and ask for a token made
for the eval (:mod:`telescope.system.access`).

Limits: the servers restart for every checkpoint (a fresh load each; a weight update
in place would save the start-up, at the cost of one more path to keep right); the
datasets are loaded once and reused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.inference.generation import ServerPool
from telescope.runtime.eval_checkpoints import EvalCheckpoint
from telescope.schema.config import TelescopeConfig
from telescope.system import event_loop

if TYPE_CHECKING:
    from telescope.orchestrator.evals import EvalRunner, EvalSink
    from telescope.recording.run_store import RunStore

#: {step: {eval name: {metric: value}}}
Results = dict[int, dict[str, dict[str, float]]]


class EvalServers:
    """The configured backend's inference servers, started without Ray or a trainer, and their pool."""

    def __init__(self, config: TelescopeConfig, run_dir: Path) -> None:
        from telescope.inference.client import InferenceClient
        from telescope.plugins.facade import get_plugins
        from telescope.system.access import new_run_token

        name = config.inference_backend
        if name == "auto":
            from telescope.inference import default_backend_name

            name = default_backend_name()
        access_token = new_run_token()  # the servers ask for it; only this process's clients hold it
        backend = get_plugins().create_inference_backend(name, config, access_token)
        count = max(1, config.inference_num_workers // config.inference_tensor_parallel_size)
        self.servers = []
        try:
            for i in range(count):
                self.servers.append(backend.start_server(i, run_dir))
        except BaseException:
            self.stop()
            raise
        clients = [
            InferenceClient(
                s.address.base_url,
                server_index=i,
                read_timeout=config.inference_request_timeout_s,
                access_token=access_token,
            )
            for i, s in enumerate(self.servers)
        ]
        self.generation = ServerPool(clients, config.vllm_scheduling_policy)

    def stop(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.stop()


def checkpoint_config(config: TelescopeConfig, checkpoint: EvalCheckpoint) -> TelescopeConfig:
    """The config the servers of ``checkpoint`` start from: its folder as the model, sized for the eval.

    The servers size their batch from ``max_concurrent_prompts_per_server x group_size`` (the
    most a run sends one server); an eval sends at most ``max_concurrent_samples_per_server``.
    """
    return config.model_copy(
        deep=True,
        update={
            "model": str(checkpoint.path),
            "max_concurrent_prompts_per_server": config.max_concurrent_samples_per_server,
            "group_size": 1,
        },
    )


def _evaluate_checkpoint(
    config: TelescopeConfig, checkpoint: EvalCheckpoint, output: Path, sink: EvalSink, runner: EvalRunner | None
) -> tuple[dict[str, dict[str, float]], EvalRunner]:
    """Serve ``checkpoint``, run every eval on it, stop the servers; returns the results and the runner."""
    from transformers import AutoTokenizer

    from telescope.orchestrator.chat import ChatRenderer
    from telescope.orchestrator.evals import EvalRunner
    from telescope.plugins.facade import get_plugins

    served = checkpoint_config(config, checkpoint)
    try:
        tokenizer = AutoTokenizer.from_pretrained(served.model)
    except (OSError, ValueError) as exc:
        raise FileNotFoundError(
            f"{checkpoint.path} (step {checkpoint.step}) holds no tokenizer ({type(exc).__name__}); copy the "
            "model's tokenizer files into it"
        ) from None
    renderer = ChatRenderer(tokenizer, config.chat_template, config.enable_thinking)
    services = EvalServers(served, output)
    try:
        if runner is None:
            runner = EvalRunner(
                config,
                get_plugins(),
                renderer,
                services.generation,
                sink,
                per_server_limit=config.max_concurrent_samples_per_server,
            )
        else:  # the same evals and datasets, this checkpoint's servers
            runner.renderer, runner.generation = renderer, services.generation
        servers = list(range(services.generation.num_servers))

        async def run() -> dict[str, dict[str, float]]:
            assert runner is not None
            try:
                return await runner.run_all(step=checkpoint.step, servers=servers, phase="standalone")
            finally:
                await services.generation.aclose()

        return event_loop.run(run()), runner
    finally:
        services.stop()


class _CheckpointSink:
    """The run store as the eval sink, each record naming the checkpoint it scored."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.checkpoint = ""

    def log_eval(self, name: str, step: int, metrics: dict[str, Any], **extra: Any) -> None:
        self.store.log_eval(name, step, metrics, checkpoint=self.checkpoint, **extra)


def run_evals(
    config: TelescopeConfig,
    checkpoints: list[EvalCheckpoint],
    output: Path,
    on_result: Callable[[int, dict[str, dict[str, float]]], None] | None = None,
) -> Results:
    """Evaluate each of ``checkpoints`` (in the order given) with ``config.evals``; see the module docstring."""
    from telescope.recording.run_store import RunStore
    from telescope.runtime.eval_wandb import EvalWandbRun

    if not config.evals:
        raise ValueError("the config has no evals; add an `evals:` list (or pass --evals '[{name: ...}]')")
    output.mkdir(parents=True, exist_ok=True)
    wandb_run = EvalWandbRun(config.wandb_run_path, output) if config.wandb_run_path else None
    store = RunStore(output)
    sink = _CheckpointSink(store)
    stop_capture = store.capture_events()
    results: Results = {}
    runner: EvalRunner | None = None
    try:
        for checkpoint in checkpoints:
            sink.checkpoint = str(checkpoint.path)
            results[checkpoint.step], runner = _evaluate_checkpoint(config, checkpoint, output, sink, runner)
            if wandb_run is not None:
                wandb_run.log(checkpoint.step, results[checkpoint.step])
            if on_result is not None:
                on_result(checkpoint.step, results[checkpoint.step])
        return results
    finally:
        stop_capture()
        store.close()
        if wandb_run is not None:
            wandb_run.finish()
