"""``telescope serve``: an inference backend and the OpenAI-compatible gateway on one model, outside a run.

What is served (:func:`model_folder`): a ``tiny:<preset>`` model, a Hugging Face model
folder, a run's checkpoint folder, or a run directory / checkpoints folder (its latest
checkpoint; :func:`~telescope.runtime.eval_checkpoints.from_argument`, as ``telescope eval``
reads its CHECKPOINT). So one agent program is pointed at the model before training and
at a checkpoint after.

How (:func:`serve`): the backend (``embedded`` by default, ``vllm`` when asked) starts
its server as a child process on a free loopback port, exactly as a run starts one, with
a token of its own that only the gateway holds (:mod:`telescope.system.access`); the
gateway (:mod:`telescope.inference.gateway`) then serves on ``host:port`` in this process
and talks to that server through the orchestrator's client. SIGTERM or Ctrl-C
stops the gateway (requests in flight finish), then the backend's process; the command
then exits 0. The backend's process also dies with this one if it is killed outright.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from telescope.schema.types import Dtype

if TYPE_CHECKING:
    from telescope.api.context import InferenceContext
    from telescope.api.inference import InferenceBackend, InferenceServer

log = logging.getLogger(__name__)

#: The backend's server binds loopback only: the gateway is the front the agent program reaches.
BACKEND_HOST = "127.0.0.1"


@dataclass(frozen=True)
class ServeOptions:
    """What ``telescope serve`` was asked for (its command-line options)."""

    source: str
    backend: str = "embedded"
    host: str = "127.0.0.1"
    port: int = 8000
    #: None: the model's own (:func:`model_context_length`)
    max_model_len: int | None = None
    dtype: Dtype = "float32"
    seed: int = 0
    max_concurrent_requests: int = 64
    api_key: str | None = None
    tool_parser: str = "auto"
    chat_template: str | None = None


def model_folder(source: str) -> str:
    """The folder (or ``tiny:`` name) the backend loads for ``source`` (ValueError with a fix when none)."""
    from telescope.models.tiny import TINY_PREFIX
    from telescope.runtime.eval_checkpoints import CheckpointSourceError, from_argument

    if source.startswith(TINY_PREFIX):
        return source
    path = Path(source)
    try:
        return str(from_argument(path).path)
    except CheckpointSourceError as exc:
        raise ValueError(str(exc)) from None


#: The context length of a model whose config.json does not say it.
FALLBACK_MAX_MODEL_LEN = 4096


def model_context_length(folder: str) -> int:
    """The model's ``max_position_embeddings`` (its config.json), else :data:`FALLBACK_MAX_MODEL_LEN`."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
        return int(config.get("max_position_embeddings") or FALLBACK_MAX_MODEL_LEN)
    return FALLBACK_MAX_MODEL_LEN


def inference_context(options: ServeOptions, model: str, access_token: str | None = None) -> InferenceContext:
    """The backend's context: ``model`` (a folder or ``tiny:`` name), loopback, the options' limits."""
    from telescope.api.context import InferenceContext
    from telescope.models.tiny import resolve_model_path

    return InferenceContext(
        model=model,
        model_dtype=options.dtype,
        seed=options.seed,
        max_model_len=options.max_model_len or model_context_length(resolve_model_path(model)),
        max_concurrent_sequences=options.max_concurrent_requests,
        host=BACKEND_HOST,
        base_port=8100,
        chat_template=options.chat_template,
        access_token=access_token,
    )


def create_backend(options: ServeOptions, context: InferenceContext) -> InferenceBackend:
    """The named backend (vLLM without tracing: no run's trace receiver listens)."""
    from telescope.plugins.facade import get_plugins

    cls = get_plugins().inference_backend(options.backend)
    if options.backend == "vllm":
        from telescope.inference.plugin import VLLMSettings

        return cls(context, VLLMSettings(enable_vllm_tracing=False))
    return cls(context)


def serve(options: ServeOptions, announce: Callable[[str], None] = print) -> None:
    """Serve until SIGTERM/SIGINT (see the module docstring); ``announce`` gets the base URL once listening."""
    import uvicorn
    from transformers import AutoTokenizer

    from telescope.inference.client import InferenceClient
    from telescope.inference.gateway.app import create_gateway_app
    from telescope.inference.gateway.service import Gateway
    from telescope.models.tiny import resolve_model_path
    from telescope.system.access import new_run_token

    model = model_folder(options.source)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model))
    listener = socket.create_server((options.host, options.port))  # bound now: --port 0 is known before serving
    stopping = _StopSignals()
    server: InferenceServer | None = None
    try:
        with stopping:
            backend_token = new_run_token()  # the backend asks for it: only this gateway calls it
            server = create_backend(options, inference_context(options, model, backend_token)).start_server(0)
            backend_url = server.address.base_url

            async def connect() -> Gateway:
                client = InferenceClient(backend_url, read_timeout=None, access_token=backend_token)
                return await Gateway.connect(
                    client,
                    tokenizer,
                    chat_template=options.chat_template,
                    tool_parser=options.tool_parser,
                    max_concurrent_requests=options.max_concurrent_requests,
                )

            host, port = listener.getsockname()[:2]
            gateway = uvicorn.Server(
                uvicorn.Config(create_gateway_app(connect, api_key=options.api_key), log_level="warning", lifespan="on")
            )
            _announce_when_started(gateway, f"http://{host}:{port}/v1", announce)
            stopping.serving = True  # from here uvicorn handles the signals (a graceful stop)
            gateway.run(sockets=[listener])
    except ServeStopped:
        log.info("telescope serve: stopped while starting")
    finally:
        with contextlib.suppress(Exception):
            listener.close()
        if server is not None:
            server.stop()


class ServeStopped(Exception):
    """SIGTERM or SIGINT arrived before the gateway served (while the backend started)."""


class _StopSignals:
    """SIGTERM/SIGINT handlers for :func:`serve`: a stop while starting raises :class:`ServeStopped`.

    While the gateway serves, uvicorn's own handlers stop it gracefully; afterwards uvicorn
    re-raises the signal it caught, which lands here and is absorbed, so the backend is
    then stopped and the command exits 0 instead of dying of the signal.
    """

    def __init__(self) -> None:
        self.serving = False
        self._previous: dict[int, Any] = {}

    def _handle(self, sig: int, frame: FrameType | None) -> None:
        if not self.serving:
            raise ServeStopped(sig)

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _announce_when_started(server: Any, url: str, announce: Callable[[str], None]) -> None:
    """Call ``announce(url)`` once uvicorn has run the app's start-up (the gateway knows its model)."""
    startup = server.startup

    async def startup_then_announce(sockets: Any = None) -> None:
        await startup(sockets=sockets)
        if server.started:
            announce(url)

    server.startup = startup_then_announce
