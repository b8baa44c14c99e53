"""The embedded engine's HTTP server: vLLM's completions API subset, metrics and weight updates.

Routes (vLLM-compatible unless marked):

- ``POST /v1/completions``: see :mod:`telescope.inference.protocol`. When the
  client disconnects (the orchestrator cancels a stale rollout and closes the
  connection), the request is aborted in the engine at the next step, as vLLM
  does; the waiting handler returns 499.
- ``GET /health`` (200 while the engine loop runs), ``GET /v1/models``,
  ``GET /metrics`` (Prometheus text, with vLLM's metric names so one scraper
  reads both backends: ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``,
  ``vllm:generation_tokens_total``, ``vllm:prompt_tokens_total``,
  ``vllm:request_success_total``, the histograms
  ``vllm:time_to_first_token_seconds`` and ``vllm:inter_token_latency_seconds``
  (see :mod:`.stats`), and ``vllm:prefix_cache_queries_total`` /
  ``vllm:prefix_cache_hits_total`` in tokens as vLLM counts them: every prompt token
  is a query; the hits are the tokens of whole prompts whose prefill the engine shared
  with an identical prompt admitted in the same step (a group's samples; it keeps no
  cache across steps); plus
  ``telescope:policy_version``, ``telescope:requests_aborted_total``,
  ``telescope:weight_updates_total``, and ``telescope:engine_steps_total`` with
  ``telescope:batched_tokens_total``: their ratio is the mean batch, the number to
  watch when generation is slower than expected).
- ``POST /collective_rpc`` with the weight-sync methods of
  :mod:`telescope.inference.weight_updates` (vLLM's dev-mode route; only those
  methods are accepted), ``POST /reset_prefix_cache`` (a no-op here: the engine
  keeps no prefix cache).
- ``POST /abort_requests`` (extension): abort by request id.
- ``POST /v1/completions/batch`` (extension): several completion requests in one POST
  (:class:`~telescope.inference.protocol.CompletionBatchRequest`), answered as
  newline-delimited JSON, one line per request as it finishes, each with its own
  response or error. The orchestrator's client sends the requests it makes in one
  event-loop iteration this way (a group's samples): one HTTP exchange instead of
  one per sample, each sample still its own engine request.

Access: with a run token (the process reads it from ``TELESCOPE_RUN_TOKEN``, never
from its command line) every route but ``/health`` answers 401 without
``Authorization: Bearer <token>`` (:mod:`telescope.system.access`); ``/health``
answers an empty 200 or 503 to anyone. Without one the server is open, and says so
in its log when it listens beyond loopback.

A completion response carries the request's ``timing`` (queued, admitted, first
token, finished; a Telescope extension field), and a weight update's result its
server-side ``start`` time, for the run's timeline.

Run it as a process with ``python -m telescope.inference.embedded.server
--engine-json engine.json --port 8100`` (what :class:`~.backend.EmbeddedBackend`
does), or in a thread of the current process with :class:`ServerThread`
(tests, notebooks). Told to stop (SIGTERM, Ctrl-C), the process lets the requests
in flight finish for at most :data:`STOP_GRACE_S`, then exits regardless: a weight
update whose sender stopped (a hung trainer rank) would otherwise hold it until the
transport's timeout, and the run's shutdown with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from pydantic_core import to_json

from telescope.inference import weight_updates
from telescope.inference.embedded.engine import Engine, EngineSettings, GenerationParams, RequestResult
from telescope.inference.protocol import (
    NEG_INF_LOGPROB,
    AbortRequest,
    CollectiveRpcRequest,
    CompletionBatchLine,
    CompletionBatchRequest,
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    RequestTiming,
    UsageInfo,
    new_request_id,
)
from telescope.system.access import RUN_TOKEN_ENV, RunTokenMiddleware, token_from_env
from telescope.system.addressing import is_loopback
from telescope.system.devices import embedded_device
from telescope.system.garbage_collection import freeze_startup_objects

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger(__name__)


def _batch_line(index: int, **fields: Any) -> bytes:
    """One line of a batch answer (NDJSON)."""
    return to_json(CompletionBatchLine(index=index, **fields)) + b"\n"


def _error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)


class _MetricsCollector:
    """Reads the engine's counters at scrape time (prometheus_client custom collector)."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        c = self.engine.counts()
        gauges = [
            ("vllm:num_requests_running", "Sequences in the running batch", c["running"]),
            ("vllm:num_requests_waiting", "Sequences waiting to be admitted", c["waiting"]),
            (
                "vllm:kv_cache_usage_perc",
                "KV cache tokens in use / (max_num_seqs * max_model_len)",
                c["kv_cache_usage"],
            ),
            ("telescope:policy_version", "Weights version the engine generates with", c["policy_version"]),
        ]
        for name, doc, value in gauges:
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], float(value))
            yield family
        counters = [
            ("vllm:generation_tokens", "Generated tokens", c["generation_tokens"]),
            ("vllm:prompt_tokens", "Prefilled prompt tokens", c["prompt_tokens"]),
            ("vllm:request_success", "Finished requests", c["requests_finished"]),
            ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache", c["prompt_tokens"]),
            ("vllm:prefix_cache_hits", "Prompt tokens whose prefill was shared", c["prefix_cache_hits"]),
            ("telescope:requests_aborted", "Aborted requests", c["requests_aborted"]),
            ("telescope:weight_updates", "Weight updates applied", c["weight_updates"]),
            (
                "telescope:engine_steps",
                "Engine steps (one batched forward: the decoding rows and any prefill)",
                c["steps"],
            ),
            (
                "telescope:batched_tokens",
                "Tokens through the model over all steps (decoded and prefilled)",
                c["batched_tokens"],
            ),
        ]
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc, labels=["model_name"])
            counter.add_metric([self.model_name], float(value))
            yield counter
        latencies = self.engine.latencies
        histograms = [
            ("vllm:time_to_first_token_seconds", "Time to first token", latencies.time_to_first_token),
            ("vllm:inter_token_latency_seconds", "Time between two tokens of a sequence", latencies.inter_token),
        ]
        for name, doc, histogram in histograms:
            buckets, total, _ = histogram.snapshot()
            histogram_family = HistogramMetricFamily(name, doc, labels=["model_name"])
            histogram_family.add_metric([self.model_name], buckets, sum_value=total)
            yield histogram_family


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _params(body: CompletionRequest) -> GenerationParams:
    return GenerationParams(
        max_tokens=body.max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        n=body.n,
        stop=body.stop_strings,
        stop_token_ids=list(body.stop_token_ids or []),
        seed=body.seed,
        num_top_logprobs=body.logprobs or 0,
        ignore_eos=body.ignore_eos,
        skip_special_tokens=body.skip_special_tokens,
        priority=body.priority,
    )


def _clamp(value: float) -> float:
    return value if value > NEG_INF_LOGPROB else NEG_INF_LOGPROB


class TokenNames:
    """Each token's string decoded alone (as vLLM names tokens in log-probabilities), cached.

    At most a vocabulary's worth of short strings. Decoding each token of every
    response with its own ``decode`` call was a tenth of the server's HTTP time; now
    a token is decoded once, with the other new ones in one ``batch_decode``.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._names: dict[int, str] = {}

    def of(self, body: CompletionRequest, result: RequestResult) -> dict[int, str]:
        """A mapping that names every token ``result``'s log-probabilities mention."""
        if body.logprobs is None:
            return {}
        ids = {t for seq in result.sequences for t in seq.token_ids}
        ids.update(t for seq in result.sequences for top in seq.top_logprobs or () for t in top)
        if body.return_tokens_as_token_ids:
            return {t: f"token_id:{t}" for t in ids}
        missing = sorted(ids.difference(self._names))
        if missing:
            decoded = self._tokenizer.batch_decode([[t] for t in missing])
            self._names.update(zip(missing, map(str, decoded), strict=True))
        return self._names


def json_response(model: BaseModel) -> Response:
    """``model`` as a JSON response, serialised by pydantic itself.

    Returning the model would have FastAPI walk it with ``jsonable_encoder`` in Python,
    a quarter of the server's CPU per completion request.
    """
    return Response(model.model_dump_json(), media_type="application/json")


def build_response(
    engine: Engine, body: CompletionRequest, result: RequestResult, model: str, token_names: TokenNames
) -> CompletionResponse:
    """Turn an engine result into the vLLM-shaped response."""
    names = token_names.of(body, result)

    choices = []
    for seq in result.sequences:
        logprobs = None
        if body.logprobs is not None:
            tokens = [names[t] for t in seq.token_ids]
            offsets, pos = [], 0
            for text in tokens:
                offsets.append(pos)
                pos += len(text)
            tops: list[dict[str, float] | None] = []
            for i in range(len(seq.token_ids)):
                top = {names[t]: _clamp(lp) for t, lp in (seq.top_logprobs[i].items() if seq.top_logprobs else ())}
                top[tokens[i]] = _clamp(seq.logprobs[i])
                tops.append(top)
            logprobs = CompletionLogProbs(
                text_offset=offsets, token_logprobs=[_clamp(x) for x in seq.logprobs], tokens=tokens, top_logprobs=tops
            )
        versions = seq.token_policy_versions
        choices.append(
            CompletionChoice(
                index=seq.index,
                text=seq.text,
                logprobs=logprobs,
                finish_reason=seq.finish_reason,
                stop_reason=seq.stop_reason,
                token_ids=seq.token_ids if body.return_token_ids else None,
                prompt_token_ids=result.prompt_token_ids if body.return_token_ids else None,
                policy_version_start=versions[0] if versions else engine.policy_version,
                policy_version_end=versions[-1] if versions else engine.policy_version,
                token_policy_versions=versions,
            )
        )
    completion = sum(len(s.token_ids) for s in result.sequences)
    prompt = len(result.prompt_token_ids)
    usage = UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
    timing = RequestTiming(**dataclasses.asdict(result.timing)) if result.timing is not None else None
    return CompletionResponse(id=result.request_id, model=model, choices=choices, usage=usage, timing=timing)


def create_app(engine: Engine, served_model_name: str | None = None, access_token: str | None = None) -> FastAPI:
    """A FastAPI app serving ``engine`` (which must be started).

    ``access_token``: the run token every route but ``/health`` asks for
    (:class:`~telescope.system.access.RunTokenMiddleware`); None serves without one
    (an engine served by hand on loopback, tests).
    """
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    model_name = served_model_name or engine.settings.served_model_name or engine.settings.model_path
    registry = CollectorRegistry()
    registry.register(_MetricsCollector(engine, model_name))
    receiver = weight_updates.WeightReceiver(device=str(engine.device))
    token_names = TokenNames(engine.tokenizer)
    app = FastAPI(title="Telescope embedded inference engine")
    app.state.engine = engine
    if access_token is not None:
        app.add_middleware(RunTokenMiddleware, token=access_token)

    @app.get("/health")
    async def health() -> Response:
        alive = engine._thread is not None and engine._thread.is_alive()
        return Response(status_code=200 if alive else 503)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(
            data=[
                ModelCard(id=model_name, root=engine.settings.model_path, max_model_len=engine.settings.max_model_len)
            ]
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    def refusal(body: CompletionRequest) -> tuple[int, str, str] | None:
        """Why the server will not run ``body`` (status, message, error type); None when it will."""
        if body.model is not None and body.model not in (model_name, engine.settings.model_path):
            return 404, f"the model {body.model!r} does not exist; this server serves {model_name!r}", "NotFoundError"
        if body.priority != 0 and engine.settings.scheduling_policy != "priority":
            return 400, "priority other than 0 needs vllm_scheduling_policy: priority", "BadRequestError"
        return None

    def submit(body: CompletionRequest) -> tuple[str, asyncio.Future[RequestResult]]:
        """Hand ``body`` to the engine; its result arrives in the returned future (ValueError: refused)."""
        prompt_ids = list(body.prompt) if isinstance(body.prompt, list) else engine.tokenize(body.prompt)
        request_id = body.request_id or new_request_id()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[RequestResult] = loop.create_future()

        def on_done(result: RequestResult) -> None:
            loop.call_soon_threadsafe(lambda: None if future.done() else future.set_result(result))

        engine.submit(request_id, prompt_ids, _params(body), on_done)
        return request_id, future

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        refused = refusal(body)
        if refused is not None:
            return _error(*refused)
        try:
            request_id, future = submit(body)
        except ValueError as exc:
            return _error(400, str(exc))
        disconnect: asyncio.Future[Any] = asyncio.ensure_future(_wait_for_disconnect(raw))
        waiters: set[asyncio.Future[Any]] = {future, disconnect}
        try:
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            engine.abort(request_id)
            disconnect.cancel()
            raise
        if future not in done:
            engine.abort(request_id)
            return Response(status_code=499)
        disconnect.cancel()
        return json_response(build_response(engine, body, future.result(), model_name, token_names))

    @app.post("/v1/completions/batch", response_model=None)
    async def completions_batch(batch: CompletionBatchRequest) -> StreamingResponse:
        """Every request of ``batch`` submitted at once; one NDJSON line each, as each finishes.

        Each request is validated and refused on its own: an invalid or refused one gets
        its error line at once and the others run. The requests are submitted inside
        the stream, so whatever ends it (the client going away, Starlette cancelling it
        before the first line, an error while submitting) aborts those still running,
        as a single request's are.
        """

        async def stream() -> AsyncIterator[bytes]:
            running: dict[asyncio.Future[RequestResult], tuple[int, str, CompletionRequest]] = {}
            try:
                for index, raw_body in enumerate(batch.requests):
                    try:
                        body = CompletionRequest.model_validate(raw_body)
                    except ValidationError as exc:
                        yield _batch_line(index, status=422, error=str(exc))
                        continue
                    refused = refusal(body)
                    try:
                        if refused is None:
                            request_id, future = submit(body)
                            running[future] = (index, request_id, body)
                    except ValueError as exc:
                        refused = (400, str(exc), "BadRequestError")
                    if refused is not None:
                        yield _batch_line(index, status=refused[0], error=refused[1])
                pending = set(running)
                while pending:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for future in done:
                        index, _, body = running[future]
                        response = build_response(engine, body, future.result(), model_name, token_names)
                        yield _batch_line(index, response=response)
            finally:  # the client went away, the stream failed, or the server stops: abort what still runs
                for future, (_, request_id, _) in running.items():
                    if not future.done():
                        engine.abort(request_id)

        return StreamingResponse(stream(), media_type="application/x-ndjson")

    @app.post("/abort_requests")
    async def abort_requests(body: AbortRequest) -> dict[str, list[str]]:
        return {"aborted": [rid for rid in body.request_ids if engine.abort(rid)]}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        return Response(status_code=200)

    @app.post("/collective_rpc", response_model=None)
    async def collective_rpc(body: CollectiveRpcRequest) -> dict[str, Any] | JSONResponse:
        arg = body.args[0] if body.args else "{}"
        try:
            if body.method == weight_updates.INIT_METHOD:
                result = await asyncio.to_thread(receiver.init, arg, 0)
            elif body.method == weight_updates.UPDATE_METHOD:
                started_at, start = time.time(), time.perf_counter()
                version, tensors = receiver.receive(arg)
                if weight_updates.should_load(arg):
                    count = await asyncio.to_thread(engine.update_weights, tensors, version, receiver.streams)
                else:  # held: take part in the transfer, keep the weights
                    count = await asyncio.to_thread(weight_updates.discard, tensors)
                result = {
                    "policy_version": engine.policy_version,
                    "num_tensors": count,
                    "seconds": time.perf_counter() - start,
                    "start": started_at,
                }
            elif body.method == weight_updates.VERSION_METHOD:
                result = {"policy_version": engine.policy_version}
            else:
                return _error(400, f"unknown method {body.method!r}; allowed: {', '.join(weight_updates.METHODS)}")
        except (KeyError, ValueError, RuntimeError, TimeoutError) as exc:
            log.exception("collective_rpc %s failed", body.method)
            return _error(500, f"{body.method} failed: {exc}", "InternalServerError")
        return {"results": [result]}

    return app


class ServerThread:
    """Serve an app with uvicorn in a background thread of this process (port 0 = any free port)."""

    def __init__(
        self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, lifespan: Literal["auto", "on", "off"] = "off"
    ) -> None:
        import uvicorn

        self.host = host
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan=lifespan)
        self.server: uvicorn.Server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        sockets = self.server.servers[0].sockets if self.server.servers else []
        return int(sockets[0].getsockname()[1])

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread = threading.Thread(target=self.server.run, name="telescope-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the embedded HTTP server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None


def main(argv: list[str] | None = None) -> None:
    """Process entry point: build the engine from its settings (JSON) and serve it until killed."""
    parser = argparse.ArgumentParser(description="Telescope embedded inference server")
    parser.add_argument("--engine-json", required=True, help="file holding the EngineSettings as JSON")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: the settings' device)")
    parser.add_argument(
        "--worker-index", type=int, default=0, help="for the settings' device 'auto': worker i takes GPU i mod count"
    )
    parser.add_argument("--log-dir", default=None, help="run directory: log records go to its logs/ folder")
    parser.add_argument("--log-name", default="inference", help="the log files' name under logs/")
    args = parser.parse_args(argv)
    with open(args.engine_json, encoding="utf-8") as handle:
        settings = EngineSettings.from_json(handle.read())
    if args.device is not None:
        settings.device = args.device
    if settings.device == "auto":
        import torch

        settings.device = embedded_device(None, args.worker_index, torch.cuda.device_count())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_dir is not None:
        from telescope.recording.run_logs import capture_process_logs

        capture_process_logs(args.log_dir, args.log_name, tee_streams=False)
    token = token_from_env()
    if token is None and not is_loopback(args.host):
        log.warning(
            "serving on %s without a run token (%s unset): anyone who reaches this port can generate and "
            "replace the weights",
            args.host,
            RUN_TOKEN_ENV,
        )
    engine = Engine(settings).start()
    freeze_startup_objects("embedded inference server")
    log.info("embedded engine serving %s on %s:%d (%s)", settings.model_path, args.host, args.port, settings.device)
    try:
        _serve_until_stopped(create_app(engine, access_token=token), args.host, args.port)
    finally:
        with contextlib.suppress(Exception):
            engine.stop()


#: Seconds the server process waits for the requests in flight once told to stop (see the module doc).
STOP_GRACE_S = 5.0


def _serve_until_stopped(app: FastAPI, host: str, port: int) -> None:
    """Serve ``app`` with uvicorn until a stop signal, then for at most :data:`STOP_GRACE_S` more."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not self.should_exit:  # the first stop signal: uvicorn's graceful stop gets a deadline
                deadline = threading.Timer(STOP_GRACE_S, _exit_now, args=(sig,))
                deadline.daemon = True
                deadline.start()
            super().handle_exit(sig, frame)

    Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).run()


def _exit_now(sig: int) -> None:
    """End the process at once (uvicorn still waits on a request in flight), its log records written."""
    log.warning(
        "inference server: still stopping %.0f s after signal %d (a request in flight, such as a weight update "
        "whose sender stopped); exiting without it",
        STOP_GRACE_S,
        sig,
    )
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(128 + sig)


if __name__ == "__main__":
    main()
