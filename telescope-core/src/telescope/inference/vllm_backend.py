"""The ``vllm`` inference backend: one ``vllm serve`` process per inference worker (GPU).

Install with ``pip install 'telescope-core[vllm]'``. Nothing in Telescope imports
vLLM: this module builds the ``vllm serve`` command and holds the worker
extension, which runs inside vLLM's worker processes and uses only the worker's
attributes, so all of it is importable and testable without vLLM.

The server (:func:`serve_command`)
    ``vllm serve MODEL`` on ``inference_host:inference_base_port + i`` (another
    free port when that one is taken) with
    ``--tensor-parallel-size`` (``inference_tensor_parallel_size``),
    ``--gpu-memory-utilization``, ``--max-model-len``, ``--max-num-seqs`` (``max_num_seqs``, see
    :func:`max_num_seqs`), ``--max-num-batched-tokens`` (``max_num_batched_tokens``, when set),
    ``--scheduling-policy``
    (``vllm_scheduling_policy``), ``--dtype`` (``model_dtype``), ``--seed``,
    ``--chat-template`` (``chat_template``, written to a file) and
    ``--default-chat-template-kwargs '{"enable_thinking": ...}'`` for chat
    routes, ``--otlp-traces-endpoint`` (see Tracing below), and always:

    - ``--logprobs-mode processed_logprobs``: log-probabilities of the
      distribution the sampler used (after temperature, then top-k/top-p with
      renormalisation), the same distribution the embedded engine reports.
      vLLM's default, ``raw_logprobs``, ignores the temperature, which would
      break the shared convention (see :mod:`telescope.inference.embedded.sampling`,
      which also says what TIS does and does not correct when ``top_p`` is set:
      the trainer's distribution is never truncated);
    - ``--generation-config vllm``: ignore the model's ``generation_config.json``
      sampling defaults (a hidden ``top_k: 20`` would silently truncate);
    - ``--worker-extension-cls`` :class:`TelescopeWorkerExtension` and
      ``VLLM_SERVER_DEV_MODE=1``, which exposes ``/collective_rpc`` (weight
      updates) and ``/reset_prefix_cache``, and other control routes of dev mode
      (``/sleep``, ``/wake_up``, ...).

    Access: with the run's token (``InferenceContext.access_token``), ``--middleware``
    :data:`TOKEN_MIDDLEWARE` (:class:`~telescope.system.access.RunTokenMiddleware`)
    asks for it on every route but ``/health``, and the process gets the token in its
    environment (:func:`serve_env`: ``TELESCOPE_RUN_TOKEN``), not on its command line,
    which ``ps`` shows. vLLM's own ``--api-key`` (here its environment twin,
    ``VLLM_API_KEY``, for the same reason) is set too, but alone it would not do: vLLM
    checks it only on paths under ``/v1``, so ``/collective_rpc``, the other dev-mode
    routes and ``/metrics`` would stay open.

    The worker's GPUs (:mod:`telescope.system.devices`): under Ray, exactly the
    ``tp`` ids Ray assigned the worker (``InferenceContext.gpu_ids``; never an index
    into the node's list, which Ray has already narrowed); without a scheduler,
    visible devices ``i * tp .. (i + 1) * tp - 1`` (of ``CUDA_VISIBLE_DEVICES`` when
    set). ``TELESCOPE_VLLM_KEEP_DEVICES=1`` keeps the environment's devices as they are.

Tracing (``enable_vllm_tracing``)
    The run starts an OTLP/HTTP trace receiver on ``otlp_receiver_port``
    (:mod:`telescope.recording.otlp_receiver`) and puts its address in the
    context (``traces_endpoint``: the orchestrator node's IP when the cluster has
    several nodes). :func:`tracing_endpoint` gives vLLM ``--otlp-traces-endpoint``
    only when that can work: a receiver runs, and vLLM's environment has the
    OpenTelemetry SDK and OTLP exporters (vLLM imports the gRPC and the HTTP
    exporter). Otherwise a warning says why (and what to install) and vLLM starts
    without tracing. :func:`serve_env` then selects the HTTP exporter
    (``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``; vLLM's default is gRPC),
    sends the run token the receiver asks for (``OTEL_EXPORTER_OTLP_TRACES_HEADERS``)
    and tags the server's spans with ``telescope.server=<worker index>``
    (``OTEL_RESOURCE_ATTRIBUTES``). The packages are looked up in this
    interpreter's environment, which is vLLM's when ``vllm`` is the console script
    beside it (:func:`vllm_executable`); a ``vllm`` found elsewhere on ``PATH`` may
    see other packages.

Requests and responses
    The orchestrator's :class:`~telescope.inference.client.InferenceClient`
    speaks to vLLM unchanged: ``prompt`` as token ids, ``return_token_ids``
    (``token_ids`` and ``prompt_token_ids`` in each choice), ``logprobs``,
    ``priority``, ``seed``; closing the connection aborts the request (vLLM's
    completions route listens for the disconnect).

Weight updates (:class:`TelescopeWorkerExtension`)
    ``/collective_rpc`` calls the extension's methods on every TP worker:
    ``telescope_init_weight_transfer`` connects the worker as receiver
    ``rank_offset + worker rank`` of the configured transport;
    ``telescope_update_weights`` receives the tensors and passes them to the
    model's own ``load_weights`` (which handles fused QKV / gate-up layouts and
    TP sharding) in place. vLLM runs these calls between engine steps, so an
    update waits for the current step; running requests then continue with the
    new weights and keep the KV computed before (as in the embedded engine). vLLM
    reports no per-token version: the client records the versions it knew at
    dispatch and at completion. The client resets the prefix cache after each
    update. Quantised checkpoints (which need post-load processing) are not
    supported.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from telescope.api.inference import InferenceBackend, InferenceServer, ServerAddress
from telescope.inference import weight_updates
from telescope.system.access import RunTokenMiddleware, with_run_token
from telescope.system.devices import worker_visible_devices
from telescope.system.processes import ProcessServer, connect_host, log_path, spawn, start_on_free_port

if TYPE_CHECKING:
    from telescope.api.context import InferenceContext
    from telescope.inference.plugin import VLLMSettings

EXTENSION_CLASS = "telescope.inference.vllm_backend.TelescopeWorkerExtension"
#: vLLM's ``--middleware``: the run-token check on every route (it reads the token from the environment).
TOKEN_MIDDLEWARE = f"{RunTokenMiddleware.__module__}.{RunTokenMiddleware.__qualname__}"

log = logging.getLogger(__name__)


def vllm_executable() -> str:
    """The ``vllm`` console script of this interpreter's environment (else the one on ``PATH``)."""
    beside = Path(sys.executable).parent / "vllm"
    return str(beside) if beside.exists() else (shutil.which("vllm") or "vllm")


def max_num_seqs(context: InferenceContext) -> int:
    """``--max-num-seqs``: the config's ``max_num_seqs``, else the most sequences the orchestrator sends a
    server (prompts per server x group size), capped at 1024 and at ``max_num_batched_tokens``."""
    if context.max_num_seqs is not None:
        return context.max_num_seqs
    return max(1, min(1024, context.max_concurrent_sequences, context.max_num_batched_tokens or 1024))


def serve_command(
    context: InferenceContext,
    worker_index: int,
    settings: VLLMSettings | None = None,
    *,
    model_path: str,
    chat_template_file: str | None = None,
    executable: str | None = None,
    port: int | None = None,
) -> list[str]:
    """The ``vllm serve`` command line of inference worker ``worker_index``."""
    settings = settings or _default_settings()
    port = context.base_port + worker_index if port is None else port
    command = [
        executable or vllm_executable(),
        "serve",
        model_path,
        "--host",
        context.host,
        "--port",
        str(port),
        "--served-model-name",
        context.model,
        "--tensor-parallel-size",
        str(context.tensor_parallel_size),
        "--gpu-memory-utilization",
        str(settings.gpu_memory_utilization),
        "--max-model-len",
        str(context.max_model_len),
        "--max-num-seqs",
        str(max_num_seqs(context)),
        "--scheduling-policy",
        context.scheduling_policy,
        "--dtype",
        context.model_dtype,
        "--seed",
        str(context.seed + worker_index),
        "--logprobs-mode",
        "processed_logprobs",
        "--generation-config",
        "vllm",
        "--worker-extension-cls",
        EXTENSION_CLASS,
    ]
    if context.max_num_batched_tokens is not None:
        command += ["--max-num-batched-tokens", str(context.max_num_batched_tokens)]
    if chat_template_file is not None:
        command += ["--chat-template", chat_template_file]
    if context.enable_thinking:
        command += ["--default-chat-template-kwargs", json.dumps({"enable_thinking": True})]
    endpoint = tracing_endpoint(context, settings)
    if endpoint is not None:
        command += ["--otlp-traces-endpoint", endpoint]
    if context.access_token is not None:  # the token itself travels in the environment (serve_env)
        command += ["--middleware", TOKEN_MIDDLEWARE]
    return command


#: What vLLM's tracing imports (module -> the distribution that provides it).
TRACING_MODULES: dict[str, str] = {
    "opentelemetry.sdk": "opentelemetry-sdk",
    "opentelemetry.exporter.otlp.proto.http": "opentelemetry-exporter-otlp-proto-http",
    "opentelemetry.exporter.otlp.proto.grpc": "opentelemetry-exporter-otlp-proto-grpc",
}
TRACING_INSTALL_HINT = "pip install opentelemetry-sdk opentelemetry-exporter-otlp"


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing
        return False


def tracing_endpoint(context: InferenceContext, settings: VLLMSettings) -> str | None:
    """The ``--otlp-traces-endpoint`` to give vLLM, or None (with a warning saying why when tracing is on)."""
    if not settings.enable_vllm_tracing:
        return None
    if context.traces_endpoint is None:
        log.warning(
            "enable_vllm_tracing is on but no trace receiver runs for this server (the run starts one on "
            "otlp_receiver_port=%d; see the orchestrator log); vLLM starts without tracing",
            settings.otlp_receiver_port,
        )
        return None
    missing = [dist for module, dist in TRACING_MODULES.items() if not _importable(module)]
    if missing:
        log.warning(
            "enable_vllm_tracing is on but vLLM's environment lacks %s, which vLLM's tracing imports; "
            "vLLM starts without tracing (to trace: %s, or set enable_vllm_tracing: false to silence this)",
            ", ".join(missing),
            TRACING_INSTALL_HINT,
        )
        return None
    return context.traces_endpoint


def _default_settings() -> VLLMSettings:
    from telescope.inference.plugin import VLLMSettings

    return VLLMSettings()


def serve_env(context: InferenceContext, worker_index: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of the ``vllm serve`` process (dev-mode routes, the run token, its GPUs)."""
    env = with_run_token(dict(os.environ if base is None else base), context.access_token)
    if context.access_token is not None:  # vLLM's own check, on its /v1 routes (the middleware covers all)
        env["VLLM_API_KEY"] = context.access_token
        if context.traces_endpoint is not None:  # the run's trace receiver asks for the token too
            env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] = f"Authorization=Bearer%20{context.access_token}"
    else:
        env.pop("VLLM_API_KEY", None)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if context.traces_endpoint is not None:  # used only when serve_command passed the endpoint
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"  # the run's receiver speaks OTLP/HTTP
        tag = f"telescope.server={worker_index}"
        env["OTEL_RESOURCE_ATTRIBUTES"] = ",".join(a for a in (env.get("OTEL_RESOURCE_ATTRIBUTES"), tag) if a)
    if env.get("TELESCOPE_VLLM_KEEP_DEVICES") != "1":
        visible = worker_visible_devices(
            context.gpu_ids, env.get("CUDA_VISIBLE_DEVICES"), worker_index, context.tensor_parallel_size
        )
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
    return env


class VLLMBackend(InferenceBackend):
    """Starts ``vllm serve`` processes (see the module docstring)."""

    name = "vllm"
    health_timeout_s: float = 1800.0

    def __init__(self, context: InferenceContext, settings: VLLMSettings | None = None) -> None:
        super().__init__(context, settings)
        self.vllm = settings or _default_settings()

    @classmethod
    def is_available(cls) -> bool:
        if importlib.util.find_spec("vllm") is None:
            return False
        import torch

        return bool(torch.cuda.is_available())

    def receivers_per_server(self) -> int:
        return self.context.tensor_parallel_size

    def start_server(self, worker_index: int, run_dir: Path | None = None) -> InferenceServer:
        context = self.context
        if not self.is_available():
            raise RuntimeError(
                "inference_backend 'vllm' needs vLLM and a CUDA GPU: pip install 'telescope-core[vllm]' "
                "on a GPU machine, or use inference_backend: embedded"
            )
        return start_on_free_port(
            lambda port: self._start(worker_index, run_dir, port), context.host, context.base_port + worker_index
        )

    def _start(self, worker_index: int, run_dir: Path | None, port: int) -> InferenceServer:
        from telescope.models.tiny import resolve_model_path

        context = self.context
        cleanup: list[Path] = []
        template_file = None
        if context.chat_template is not None:
            handle, name = tempfile.mkstemp(prefix="telescope-chat-template-", suffix=".jinja")
            os.close(handle)
            Path(name).write_text(context.chat_template, encoding="utf-8")
            template_file = name
            cleanup.append(Path(name))
        command = serve_command(
            context,
            worker_index,
            self.vllm,
            model_path=resolve_model_path(context.model),
            chat_template_file=template_file,
            port=port,
        )
        log_file = log_path(run_dir, worker_index, self.name)
        process = spawn(command, serve_env(context, worker_index), log_file)
        address = ServerAddress(connect_host(context.host), port)
        server = ProcessServer(process, address, log_file, cleanup, bind_host=context.host)
        return server.wait_until_healthy(self.health_timeout_s)


class TelescopeWorkerExtension:
    """Mixed into vLLM's GPU worker (``--worker-extension-cls``); methods called via ``collective_rpc``.

    Relies on the worker's ``device``, ``rank`` and ``model_runner.model`` (whose
    ``load_weights(iterable of (name, tensor))`` every vLLM model implements).
    Arguments arrive as JSON strings; results are JSON-able dicts.
    """

    _telescope_receiver: weight_updates.WeightReceiver | None = None
    _telescope_version: int = 0

    def _telescope_model(self) -> Any:
        runner = self.model_runner  # type: ignore[attr-defined]
        model = getattr(runner, "model", None)
        return model if model is not None else runner.get_model()

    def telescope_init_weight_transfer(self, payload: str) -> dict[str, Any]:
        receiver = weight_updates.WeightReceiver(device=str(getattr(self, "device", "cuda")))
        result = receiver.init(payload, local_rank=int(getattr(self, "rank", 0)))
        self._telescope_receiver = receiver
        return result

    def telescope_update_weights(self, payload: str) -> dict[str, Any]:
        if self._telescope_receiver is None:
            raise RuntimeError(f"call {weight_updates.INIT_METHOD} before {weight_updates.UPDATE_METHOD}")
        started_at, start = time.time(), time.perf_counter()
        version, tensors = self._telescope_receiver.receive(payload)
        if not weight_updates.should_load(payload):  # held: take part in the transfer, keep the weights
            count = weight_updates.discard(tensors)
            return {
                "policy_version": self._telescope_version,
                "num_tensors": count,
                "seconds": time.perf_counter() - start,
                "start": started_at,
            }
        counted: list[int] = [0]

        def counting() -> Any:
            for item in tensors:
                counted[0] += 1
                yield item

        self._telescope_model().load_weights(weights=counting())
        self._telescope_version = version
        return {
            "policy_version": version,
            "num_tensors": counted[0],
            "seconds": time.perf_counter() - start,
            "start": started_at,
        }

    def telescope_policy_version(self) -> dict[str, Any]:
        return {"policy_version": self._telescope_version}
