"""The ``embedded`` inference backend: one embedded-engine server process per inference worker.

Worker ``i`` listens on ``inference_host:inference_base_port + i`` and runs
``python -m telescope.inference.embedded.server`` with the engine's settings
(written as JSON next to its log). :meth:`EmbeddedBackend.start_server` returns
once ``/health`` answers. The engine uses CUDA when the process sees a GPU
(worker ``i`` takes visible device ``i mod count``), else the CPU. It is the
default wherever vLLM is not usable (``inference_backend: auto``).

For tests and notebooks, :func:`start_in_thread` serves an engine from a thread
of the current process instead (no process start-up, shares the GIL).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from telescope.api.inference import InferenceBackend, InferenceServer, ServerAddress
from telescope.runtime.processes import ProcessServer, connect_host, log_path, spawn

if TYPE_CHECKING:
    from telescope.api.context import InferenceContext
    from telescope.inference.embedded.engine import Engine
    from telescope.inference.embedded.server import ServerThread


class EmbeddedBackend(InferenceBackend):
    """Starts embedded-engine servers as child processes."""

    name = "embedded"
    health_timeout_s: float = 300.0

    def _device(self, worker_index: int) -> str:
        import torch

        if not torch.cuda.is_available():
            return "cpu"
        return f"cuda:{worker_index % torch.cuda.device_count()}"

    def start_server(self, worker_index: int, run_dir: Path | None = None) -> InferenceServer:
        from telescope.inference.embedded.records import EngineSettings

        context = self.context
        port = context.base_port + worker_index
        log_file = log_path(run_dir, worker_index, self.name, console=True)
        cleanup: list[Path] = []
        if run_dir is not None:
            config_file = Path(run_dir) / "logs" / f"inference_{worker_index}_engine.json"
        else:
            handle, name = tempfile.mkstemp(prefix="telescope-embedded-", suffix=".json")
            os.close(handle)
            config_file = Path(name)
            cleanup.append(config_file)
        device = self._device(worker_index)
        config_file.write_text(EngineSettings.from_context(context, device=device).to_json(), encoding="utf-8")
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
        ]
        if run_dir is not None:  # the server writes its log records; its console goes to log_file
            command += ["--log-dir", str(run_dir), "--log-name", f"inference_{worker_index}"]
        env = dict(os.environ)
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        process = spawn(command, env, log_file)
        server = ProcessServer(process, ServerAddress(connect_host(context.host), port), log_file, cleanup)
        return server.wait_until_healthy(self.health_timeout_s)


def start_in_thread(context: InferenceContext, port: int = 0, device: str | None = None) -> tuple[Engine, ServerThread]:
    """An engine and its HTTP server in this process (``port=0``: any free port on 127.0.0.1)."""
    from telescope.inference.embedded.engine import Engine, EngineSettings
    from telescope.inference.embedded.server import ServerThread, create_app

    engine = Engine(EngineSettings.from_context(context, device=device)).start()
    return engine, ServerThread(create_app(engine), host="127.0.0.1", port=port).start()
