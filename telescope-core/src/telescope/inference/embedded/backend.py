"""The ``embedded`` inference backend: one embedded-engine server process per inference worker.

Worker ``i`` listens on ``inference_host:inference_base_port + i`` and runs
``python -m telescope.inference.embedded.server`` with the engine's settings
(written as JSON next to its log). :meth:`EmbeddedBackend.start_server` returns
once ``/health`` answers (on another port when that one is taken, say by another
run's server: :func:`~telescope.system.processes.start_on_free_port`). The engine uses
CUDA when the process sees a GPU, else the CPU: under Ray, the GPU Ray assigned the
worker (``InferenceContext.gpu_ids``: the server process sees only those); without
a scheduler, worker ``i`` takes visible device ``i mod count``
(:func:`telescope.system.devices.embedded_device`). It is the default wherever
vLLM is not usable (``inference_backend: auto``).

With the run's token (``InferenceContext.access_token``) the server asks for it on
every route but ``/health``; the process gets it in its environment
(``TELESCOPE_RUN_TOKEN``), never on its command line.

For tests and notebooks, :func:`start_in_thread` serves an engine from a thread
of the current process instead (no process start-up, shares the GIL).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from telescope.api.inference import InferenceBackend, InferenceServer, ServerAddress
from telescope.system.access import with_run_token
from telescope.system.devices import embedded_device
from telescope.system.processes import ProcessServer, connect_host, log_path, spawn, start_on_free_port

if TYPE_CHECKING:
    from telescope.api.context import InferenceContext
    from telescope.inference.embedded.engine import Engine
    from telescope.inference.embedded.server import ServerThread


class EmbeddedBackend(InferenceBackend):
    """Starts embedded-engine servers as child processes."""

    name = "embedded"
    health_timeout_s: float = 300.0

    def _device(self) -> str:
        """``cuda:0`` for a worker Ray assigned GPUs to (its process sees only those), else ``auto``.

        ``auto`` lets the server process choose (:func:`telescope.inference.embedded.server.main`,
        by its ``--worker-index``). Choosing here would import torch in this process only to
        look for a GPU: about 2 s before the server could be spawned, where the server
        imports torch anyway.
        """
        return embedded_device(self.context.gpu_ids, 0, 0) if self.context.gpu_ids else "auto"

    def start_server(self, worker_index: int, run_dir: Path | None = None) -> InferenceServer:
        context = self.context
        return start_on_free_port(
            lambda port: self._start(worker_index, run_dir, port), context.host, context.base_port + worker_index
        )

    def _start(self, worker_index: int, run_dir: Path | None, port: int) -> InferenceServer:
        from telescope.inference.embedded.records import EngineSettings
        from telescope.inference.plugin import EmbeddedSettings

        context = self.context
        log_file = log_path(run_dir, worker_index, self.name, console=True)
        cleanup: list[Path] = []
        if run_dir is not None:
            config_file = Path(run_dir) / "logs" / f"inference_{worker_index}_engine.json"
        else:
            handle, name = tempfile.mkstemp(prefix="telescope-embedded-", suffix=".json")
            os.close(handle)
            config_file = Path(name)
            cleanup.append(config_file)
        settings = EngineSettings.from_context(context, device=self._device())
        if isinstance(self.settings, EmbeddedSettings):
            settings = dataclasses.replace(settings, prefix_cache_tokens=self.settings.embedded_prefix_cache_tokens)
        else:  # built without a config (telescope serve): the field's default
            default = EmbeddedSettings.model_fields["embedded_prefix_cache_tokens"].default
            settings = dataclasses.replace(settings, prefix_cache_tokens=default)
        config_file.write_text(settings.to_json(), encoding="utf-8")
        command = [
            sys.executable,
            "-m",
            "telescope.inference.embedded.server",
            "--engine-json",
            str(config_file),
            "--host",
            context.host,
            "--port",
            str(port),
            "--worker-index",
            str(worker_index),
        ]
        if run_dir is not None:  # the server writes its log records; its console goes to log_file
            command += ["--log-dir", str(run_dir), "--log-name", f"inference_{worker_index}"]
        env = with_run_token(dict(os.environ), context.access_token)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        if context.gpu_ids:  # the process sees exactly the GPUs Ray assigned this worker
            env["CUDA_VISIBLE_DEVICES"] = ",".join(context.gpu_ids)
        process = spawn(command, env, log_file)
        address = ServerAddress(connect_host(context.host), port)
        server = ProcessServer(process, address, log_file, cleanup, bind_host=context.host)
        return server.wait_until_healthy(self.health_timeout_s)


def start_in_thread(context: InferenceContext, port: int = 0, device: str | None = None) -> tuple[Engine, ServerThread]:
    """An engine and its HTTP server in this process (``port=0``: any free port on 127.0.0.1)."""
    from telescope.inference.embedded.engine import Engine, EngineSettings
    from telescope.inference.embedded.server import ServerThread, create_app

    engine = Engine(EngineSettings.from_context(context, device=device)).start()
    app = create_app(engine, access_token=context.access_token)
    return engine, ServerThread(app, host="127.0.0.1", port=port).start()
