"""The orchestrator's one client for every inference server (embedded engine or vLLM).

One :class:`InferenceClient` per server, over one ``httpx.AsyncClient`` on an
aiohttp transport (:mod:`telescope.inference.http_transport`: httpcore's pool
cost grows with the requests in flight); POSTs (completions, aborts, weight RPCs)
skip the ``httpx.AsyncClient`` layers and go to the transport's ``post_json``, with
the body serialised by pydantic-core (a transport passed in, such as a test's
``httpx.MockTransport``, gets every request through httpx):

- :meth:`~InferenceClient.complete`: a completion from prompt token ids (or
  text), with ``return_token_ids`` and ``logprobs`` always requested, parsed
  into :class:`CompletionResult` (token ids, per-token log-probabilities of the
  temperature-scaled distribution, finish reason, policy versions). The
  completions asked for in one event-loop iteration share one POST where the
  server has the embedded engine's batch route, each still its own request
  (:mod:`telescope.inference.request_batching`; ``batch_requests=False`` sends
  each alone, as it is sent to a server without the route);
- abort: cancel the awaiting task (``task.cancel()``) and the client closes the
  connection; both servers abort a request whose client disconnected (vLLM's
  completions route and the embedded server listen for the disconnect). A batched
  request whose POST others still wait on is aborted by id instead.
  :meth:`~InferenceClient.abort` additionally aborts by id on the embedded server;
- weight updates: :meth:`~InferenceClient.init_weight_transfer` once and
  :meth:`~InferenceClient.update_weights` per step, through ``/collective_rpc``
  (see :mod:`telescope.inference.weight_updates`), then ``/reset_prefix_cache`` so
  vLLM does not reuse prompt KV computed with the old weights (each load is a
  ``weights.load`` event);
- :meth:`~InferenceClient.health`, :meth:`~InferenceClient.wait_until_healthy`,
  :meth:`~InferenceClient.metrics` (Prometheus text parsed to a dict).

Policy versions: the embedded engine reports, per sample, the weights version
of its first and last token and of every token. vLLM reports none, so the client
fills ``policy_version_start`` with the version it knew at dispatch (the last
update it completed on this server) and ``policy_version_end`` with the one it
knows when the response arrives; ``token_policy_versions`` stays ``None``. For
staleness accounting use ``policy_version_start`` (the oldest weights that
contributed).

Timeline events (:mod:`telescope.api.events`): every :meth:`~InferenceClient.complete`
emits one ``inference.request`` (dispatch time, duration, ``server``, ``request_id``,
prompt and completion tokens, ``finish_reason`` or ``aborted``, the policy versions),
plus the server-side phases ``inference.queue``, ``inference.prefill`` and
``inference.decode`` when the response carries ``timing`` (the embedded engine; vLLM's
phases come from its OTLP spans). The caller's ids (``group_id``, ``sample_id``,
``turn``) come from :func:`telescope.api.events.context`.

Access: ``access_token`` (the run token, :mod:`telescope.system.access`) goes in
``Authorization: Bearer`` on every request, health and metrics included; a server
that asks for it answers 401 without it, which is raised at once, not retried.

Retries (tenacity): connection failures and 503 are retried with exponential
back-off (a server still starting, a restart); anything else is raised at once,
because a completion is not free to repeat. ``read_timeout`` bounds the wait for
every answer (a run sets it from ``inference_request_timeout_s``: a request to a
hung server fails instead of blocking forever); None waits without limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic_core import to_json
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from telescope.api.events import emit
from telescope.inference import weight_updates
from telescope.inference.http_transport import JSON_HEADERS, AiohttpTransport, StreamedResponse
from telescope.inference.protocol import CompletionResponse, RequestTiming, new_request_id
from telescope.inference.request_batching import BatchLineError, BatchRouteMissing, RequestBatcher
from telescope.system.access import authorization_header

#: The embedded server's route for several completions in one POST (:mod:`telescope.inference.request_batching`).
BATCH_PATH = "/v1/completions/batch"


class InferenceServerError(RuntimeError):
    """The server answered with an error (the message carries its status and text)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"inference server error {status}: {message}")
        self.status = status


@dataclass
class Completion:
    """One sampled completion of a request."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    stop_reason: int | str | None
    prompt_token_ids: list[int]
    policy_version_start: int
    policy_version_end: int
    token_policy_versions: list[int] | None = None
    #: per token, the alternatives the server named (token string -> log-probability), when asked for
    top_logprobs: list[dict[str, float] | None] | None = None


@dataclass
class CompletionResult:
    request_id: str
    prompt_token_ids: list[int]
    completions: list[Completion]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    timing: RequestTiming | None = None


def build_completion_request(
    prompt: Sequence[int] | str,
    *,
    model: str | None = None,
    max_tokens: int = 16,
    temperature: float = 1.0,
    top_p: float | None = None,
    n: int = 1,
    stop: Sequence[str] | None = None,
    stop_token_ids: Sequence[int] | None = None,
    seed: int | None = None,
    priority: int = 0,
    num_logprobs: int = 0,
    request_id: str | None = None,
    ignore_eos: bool = False,
) -> dict[str, Any]:
    """The JSON body of ``POST /v1/completions`` (valid for vLLM and the embedded engine)."""
    body: dict[str, Any] = {
        "prompt": list(prompt) if not isinstance(prompt, str) else prompt,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "n": n,
        "logprobs": num_logprobs,
        "return_token_ids": True,
        "skip_special_tokens": True,
        "request_id": request_id or new_request_id(),
    }
    if model is not None:
        body["model"] = model
    if top_p is not None:
        body["top_p"] = top_p
    if stop:
        body["stop"] = list(stop)
    if stop_token_ids:
        body["stop_token_ids"] = list(stop_token_ids)
    if seed is not None:
        body["seed"] = seed
    if priority:
        body["priority"] = priority
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def parse_completion_response(
    payload: dict[str, Any] | bytes | CompletionResponse, dispatch_version: int, known_version: int
) -> CompletionResult:
    """Turn a vLLM or embedded ``/v1/completions`` response (parsed, or its JSON body) into a :class:`CompletionResult`.

    A body is parsed and validated by pydantic in one pass, without building Python dicts first.
    """
    if isinstance(payload, CompletionResponse):
        response = payload
    elif isinstance(payload, bytes):
        response = CompletionResponse.model_validate_json(payload)
    else:
        response = CompletionResponse.model_validate(payload)
    completions: list[Completion] = []
    prompt_ids: list[int] = []
    for choice in sorted(response.choices, key=lambda c: c.index):
        if choice.token_ids is None:
            raise InferenceServerError(
                200, "the response has no token_ids; the server must support return_token_ids (vLLM >= 0.10.2)"
            )
        token_logprobs = choice.logprobs.token_logprobs if choice.logprobs is not None else []
        if len(token_logprobs) != len(choice.token_ids):
            raise InferenceServerError(
                200, f"choice {choice.index} has {len(choice.token_ids)} tokens but {len(token_logprobs)} logprobs"
            )
        prompt_ids = list(choice.prompt_token_ids or prompt_ids)
        completions.append(
            Completion(
                index=choice.index,
                text=choice.text,
                token_ids=list(choice.token_ids),
                logprobs=[float(x) if x is not None else 0.0 for x in token_logprobs],
                finish_reason=choice.finish_reason or "abort",
                stop_reason=choice.stop_reason,
                prompt_token_ids=list(choice.prompt_token_ids or []),
                policy_version_start=(
                    choice.policy_version_start if choice.policy_version_start is not None else dispatch_version
                ),
                policy_version_end=choice.policy_version_end
                if choice.policy_version_end is not None
                else known_version,
                token_policy_versions=choice.token_policy_versions,
                top_logprobs=choice.logprobs.top_logprobs if choice.logprobs is not None else None,
            )
        )
    usage = response.usage
    return CompletionResult(
        request_id=response.id,
        prompt_token_ids=prompt_ids,
        completions=completions,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens or 0,
        timing=response.timing,
    )


#: The server-side phases of a request: (event kind, timing field it starts at, field it ends at).
PHASES = (
    ("inference.queue", "queued", "started"),
    ("inference.prefill", "started", "first_token"),
    ("inference.decode", "first_token", "finished"),
)


def emit_request_events(
    result: CompletionResult | None,
    *,
    start: float,
    duration_s: float,
    server: int | None,
    request_id: str,
    dispatch_version: int,
    known_version: int,
    prompt_tokens: int | None,
    error: str | None = None,
) -> None:
    """``inference.request`` for one request (``result`` None: aborted or failed), then its server phases."""
    ids = {"component": "inference", "server": server, "request_id": request_id}
    if result is None:
        emit(
            "inference.request",
            start=start,
            duration_s=duration_s,
            **ids,
            prompt_tokens=prompt_tokens,
            completion_tokens=0,
            finish_reason="aborted" if error is None else "error",
            aborted=error is None,
            error=error,
            policy_version_start=dispatch_version,
            policy_version_end=known_version,
        )
        return
    first = result.completions[0] if result.completions else None
    emit(
        "inference.request",
        start=start,
        duration_s=duration_s,
        **ids,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        n=len(result.completions),
        finish_reason=first.finish_reason if first is not None else None,
        aborted=first is not None and first.finish_reason == "abort",
        policy_version_start=first.policy_version_start if first is not None else dispatch_version,
        policy_version_end=first.policy_version_end if first is not None else known_version,
    )
    timing = result.timing
    if timing is None:
        return
    for kind, begin, end in PHASES:
        begin_at, end_at = getattr(timing, begin), getattr(timing, end)
        if begin_at is not None and end_at is not None:
            emit(kind, start=begin_at, duration_s=max(0.0, end_at - begin_at), **ids)


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        return True
    return isinstance(exc, InferenceServerError) and exc.status == 503


class InferenceClient:
    """Async client of one inference server (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        max_retries: int = 4,
        connect_timeout: float = 10.0,
        read_timeout: float | None = None,
        max_connections: int = 4096,
        initial_policy_version: int = 0,
        http_transport: httpx.AsyncBaseTransport | None = None,
        server_index: int | None = None,
        batch_requests: bool = True,
        access_token: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.server_index = server_index  # the ``server`` of this client's timeline events
        self.model = model
        self.max_retries = max_retries
        self.policy_version = initial_policy_version
        self.read_timeout = read_timeout
        timeout = httpx.Timeout(connect=connect_timeout, read=read_timeout, write=60.0, pool=None)
        transport = http_transport or AiohttpTransport(max_connections=max_connections)
        auth = authorization_header(access_token)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, transport=transport, headers=auth)
        self._post_headers = {**JSON_HEADERS, **auth}
        # POSTs go straight to aiohttp when it is the transport (AiohttpTransport.post_json)
        self._direct = transport if isinstance(transport, AiohttpTransport) else None
        self._timeouts = timeout.as_dict()
        # completions of one event-loop iteration share a POST where the server has the batch route
        self._batcher = RequestBatcher(self._send_batch, self.abort) if batch_requests and self._direct else None

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------------ basics
    def _retrying(self, retry: bool = True) -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_attempt(self.max_retries if retry else 1),
            wait=wait_exponential(multiplier=0.1, max=2.0),
            retry=retry_if_exception(_retryable),
            reraise=True,
        )

    async def _request(self, method: str, path: str, *, json: Any = None, retry: bool = True) -> httpx.Response:
        async for attempt in self._retrying(retry):
            with attempt:
                if self._direct is not None and method == "POST" and json is not None:
                    response = await self._direct.post_json(
                        self.base_url + path, to_json(json), self._timeouts, self._post_headers
                    )
                else:
                    response = await self._http.request(method, path, json=json)
                if response.status_code >= 400:
                    raise InferenceServerError(response.status_code, response.text[:2000])
                return response
        raise AssertionError("unreachable")  # pragma: no cover

    async def health(self) -> bool:
        try:
            response = await self._http.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def wait_until_healthy(self, timeout: float = 600.0, interval: float = 0.2) -> None:
        deadline = time.monotonic() + timeout
        while not await self.health():
            if time.monotonic() > deadline:
                raise TimeoutError(f"inference server {self.base_url} was not healthy within {timeout:.0f} s")
            await asyncio.sleep(interval)

    async def models(self) -> list[str]:
        return [m["id"] for m in await self.model_cards()]

    async def model_cards(self) -> list[dict[str, Any]]:
        """The server's ``/v1/models`` entries (``id``, ``max_model_len`` on vLLM and the embedded engine)."""
        response = await self._request("GET", "/v1/models")
        return list(response.json().get("data", []))

    async def metrics(self) -> dict[str, float]:
        """Prometheus samples as ``{"name{label=value,...}": value}`` (and the bare name, summed over labels)."""
        from prometheus_client.parser import text_string_to_metric_families

        response = await self._request("GET", "/metrics")
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(response.text):
            for s in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
                if labels:
                    out[s.name] = out.get(s.name, 0.0) + s.value
        return out

    # ------------------------------------------------------------- completions
    async def complete(self, prompt: Sequence[int] | str, **options: Any) -> CompletionResult:
        """One completion request (options: see :func:`build_completion_request`).

        Cancelling the awaiting task aborts the request on the server: by id when it went
        in a batch others still wait on, else by closing its connection.
        """
        body = build_completion_request(prompt, model=options.pop("model", self.model), **options)
        dispatch_version = self.policy_version
        start, t0 = time.time(), time.perf_counter()
        result: CompletionResult | None = None
        error: str | None = None
        try:
            answer = await self._post_completion(body)
            result = parse_completion_response(answer, dispatch_version, self.policy_version)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:  # also when cancelled (the request is then aborted on the server)
            emit_request_events(
                result,
                start=start,
                duration_s=time.perf_counter() - t0,
                server=self.server_index,
                request_id=str(body["request_id"]),
                dispatch_version=dispatch_version,
                known_version=self.policy_version,
                prompt_tokens=len(body["prompt"]) if isinstance(body["prompt"], list) else None,
                error=error,
            )
        return result

    async def _post_completion(self, body: dict[str, Any]) -> bytes | CompletionResponse:
        """The completion's answer: through the batcher where the server takes batches, else its own POST."""
        if self._batcher is not None and self._batcher.supported:
            try:
                return await self._batcher.complete(body, self.read_timeout)
            except BatchRouteMissing:
                pass  # this server takes one request per POST (vLLM)
            except BatchLineError as exc:
                raise InferenceServerError(exc.status, exc.message) from None
            except TimeoutError as exc:
                request = httpx.Request("POST", self.base_url + BATCH_PATH)
                raise httpx.ReadTimeout(f"no answer within {self.read_timeout} s", request=request) from exc
        response = await self._request("POST", "/v1/completions", json=body)
        return response.content

    @contextlib.asynccontextmanager
    async def _send_batch(self, bodies: list[dict[str, Any]]) -> AsyncIterator[AsyncIterator[bytes]]:
        """POST ``bodies`` to the batch route (retried as a single POST is); yields its answer's lines."""
        assert self._direct is not None
        payload = to_json({"requests": bodies})
        timeouts = {**self._timeouts, "read": None}  # each request waits for its own line (RequestBatcher)
        response: StreamedResponse | None = None
        async for attempt in self._retrying():
            with attempt:
                response = await self._direct.open_post(
                    self.base_url + BATCH_PATH, payload, timeouts, self._post_headers
                )
                if response.status >= 400:
                    text = await response.text()
                    response.close()
                    if response.status in (404, 405):
                        raise BatchRouteMissing(text[:200])
                    raise InferenceServerError(response.status, text[:2000])
        assert response is not None
        try:
            yield response.lines()
        finally:
            response.close()

    async def abort(self, request_ids: Sequence[str]) -> list[str]:
        """Abort by id (embedded engine); vLLM aborts on disconnect only, so there this returns []."""
        try:
            response = await self._request(
                "POST", "/abort_requests", json={"request_ids": list(request_ids)}, retry=False
            )
        except InferenceServerError as exc:
            if exc.status == 404:
                return []
            raise
        return list(response.json().get("aborted", []))

    # ----------------------------------------------------------------- weights
    async def collective_rpc(self, method: str, payload: str | None = None, timeout: float | None = None) -> list[Any]:
        body: dict[str, Any] = {"method": method, "args": [payload] if payload is not None else []}
        if timeout is not None:
            body["timeout"] = timeout
        response = await self._request("POST", "/collective_rpc", json=body, retry=False)
        if not response.content:
            return []
        return list(response.json().get("results", []))

    async def init_weight_transfer(
        self,
        transport: str,
        init_info: dict[str, Any],
        rank_offset: int,
        settings: dict[str, Any] | None = None,
        context: dict[str, Any] | None = None,
    ) -> list[Any]:
        """Connect every worker of the server as a receiver (ranks ``rank_offset + local rank``).

        ``settings`` and ``context`` are the transport's own settings and its
        :class:`~telescope.api.context.TransportContext`, as JSON-able dicts.
        """
        payload = weight_updates.init_payload(transport, init_info, rank_offset, settings, context)
        return await self.collective_rpc(weight_updates.INIT_METHOD, payload)

    async def update_weights(self, version: int, *, load: bool = True) -> list[Any]:
        """Receive and load weights ``version`` (run concurrently with the sender), then drop stale prefix KV.

        Emits one ``weights.load`` event per worker of the server (``worker``: its index in
        the results), starting when the worker began receiving (its own clock; when
        the call was made if it does not say) and lasting the seconds it reports.

        ``load=False`` *holds* the server's weights: it takes part in the transfer of
        ``version`` (a collective transport needs every receiver) but keeps the weights it
        has, and so does :attr:`policy_version`; the events are ``weights.hold`` (with
        ``version``, the one passed by, and ``held_version``, the one kept).
        """
        requested = time.time()
        payload = weight_updates.update_payload(version, load)
        results = await self.collective_rpc(weight_updates.UPDATE_METHOD, payload)
        if load:
            self.policy_version = version
        for worker, result in enumerate(results):
            if isinstance(result, dict):
                timing = {
                    "start": float(result.get("start", requested)),
                    "duration_s": float(result.get("seconds", time.time() - requested)),
                }
                if load:
                    emit(
                        "weights.load",
                        **timing,
                        component="inference",
                        server=self.server_index,
                        worker=worker,
                        version=result.get("policy_version", version),
                        tensors=result.get("num_tensors"),
                    )
                else:
                    emit(
                        "weights.hold",
                        **timing,
                        component="inference",
                        server=self.server_index,
                        worker=worker,
                        version=version,
                        held_version=result.get("policy_version", self.policy_version),
                        tensors=result.get("num_tensors"),
                    )
        if load:
            await self._request("POST", "/reset_prefix_cache", retry=False)
        return results

    async def get_policy_version(self) -> int:
        results = await self.collective_rpc(weight_updates.VERSION_METHOD)
        return int(results[0]["policy_version"]) if results else self.policy_version
