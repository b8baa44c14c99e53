"""An OTLP/HTTP trace receiver that turns vLLM's request spans into timeline events.

vLLM started with ``--otlp-traces-endpoint`` exports one span per finished request
(``llm_request``) through the OpenTelemetry SDK. The run starts this receiver in
the orchestrator process (``enable_vllm_tracing`` with the ``vllm`` backend, on
``otlp_receiver_port``) and points every vLLM server at it (see
:func:`telescope.inference.vllm_backend.tracing_endpoint`). It serves the OTLP/HTTP
trace route, ``POST /v1/traces``, with FastAPI and uvicorn in a daemon thread:

- bodies: ``application/x-protobuf`` (what the SDK's OTLP/HTTP exporter sends),
  or ``application/json`` (OTLP's JSON mapping: hex trace and span ids), optionally
  ``Content-Encoding: gzip`` or ``deflate``; decoded with ``opentelemetry-proto``'s
  ``ExportTraceServiceRequest``. The answer is an empty ``ExportTraceServiceResponse``
  (a malformed body gets 400 and is dropped).
- each request span (named ``llm_request`` or carrying ``gen_ai.request.id`` or
  ``gen_ai.latency.*`` attributes; other spans are ignored) becomes events with
  ``component="vllm"``, ``request_id`` (``gen_ai.request.id``; vLLM may prefix the
  id the client sent, e.g. ``cmpl-``), ``server`` (the resource attribute
  ``telescope.server`` the run sets per server, else the service name) and
  ``trace_id``:

  - ``inference.request``: the whole span (start: arrival at the engine), with
    ``prompt_tokens``, ``completion_tokens``, ``queue_s``, ``ttft_s``, ``prefill_s``,
    ``decode_s``, ``inference_s``, ``e2e_s``, ``finish_reasons``, ``max_tokens``,
    ``n``, ``temperature``, ``top_p`` when present;
  - ``inference.queue``, ``inference.prefill``, ``inference.decode``: one per
    phase whose duration the span carries (``gen_ai.latency.time_in_queue``,
    ``...time_in_model_prefill``, ``...time_in_model_decode``).

Placing the phases: vLLM reports their durations, measured on the engine core's
clock, not their start times. The first token is at ``span start + ttft`` (both on
the wall clock); prefill ends there, decode starts there, the queue ends where
prefill starts. Without a ``ttft`` the phases are placed back from the span's end
(``span start + e2e``). So phases are exact in length and placed to within the
front end's few milliseconds of tokenisation and IPC; a phase is never placed
before the span's start.

Access: given the run token (``access_token``), the receiver answers 401 to an
export without it (:class:`~telescope.system.access.RunTokenMiddleware`); the run
has vLLM send it (``OTEL_EXPORTER_OTLP_TRACES_HEADERS``). The run binds it on
loopback, or on its node's address when the run has several nodes.

Limits: traces only (no metrics or logs routes).
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import socket
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request  # at module level: FastAPI resolves the route's annotations here

from telescope.recording.infra_monitor import Event, publish
from telescope.system.access import RunTokenMiddleware

if TYPE_CHECKING:
    import uvicorn
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

log = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"
REQUEST_SPAN = "llm_request"
SERVER_ATTRIBUTE = "telescope.server"

#: Span attribute (vLLM's ``SpanAttributes``) -> field of the inference.request event.
REQUEST_FIELDS: dict[str, str] = {
    "gen_ai.usage.prompt_tokens": "prompt_tokens",
    "gen_ai.usage.completion_tokens": "completion_tokens",
    "gen_ai.latency.time_in_queue": "queue_s",
    "gen_ai.latency.time_to_first_token": "ttft_s",
    "gen_ai.latency.time_in_model_prefill": "prefill_s",
    "gen_ai.latency.time_in_model_decode": "decode_s",
    "gen_ai.latency.time_in_model_inference": "inference_s",
    "gen_ai.latency.e2e": "e2e_s",
    "gen_ai.request.max_tokens": "max_tokens",
    "gen_ai.request.n": "n",
    "gen_ai.request.temperature": "temperature",
    "gen_ai.request.top_p": "top_p",
    "gen_ai.response.model": "model",
}


class BadPayload(ValueError):
    """The body is not an OTLP trace export this receiver can read."""


# ------------------------------------------------------------------ decoding


def decode_request(body: bytes, content_type: str = "", content_encoding: str = "") -> ExportTraceServiceRequest:
    """Parse an OTLP/HTTP trace export (protobuf or JSON, optionally gzip/deflate-compressed)."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    encoding = content_encoding.strip().lower()
    try:
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        elif encoding not in ("", "identity"):
            raise BadPayload(f"unsupported Content-Encoding {content_encoding!r}")
    except (OSError, zlib.error, EOFError) as exc:
        raise BadPayload(f"cannot decompress the body: {exc}") from None
    request = ExportTraceServiceRequest()
    if "json" in content_type.lower():
        try:
            payload = json.loads(body)
            _hex_ids_to_base64(payload)
            json_format.ParseDict(payload, request, ignore_unknown_fields=True)
        except (ValueError, json_format.ParseError) as exc:
            raise BadPayload(f"malformed OTLP JSON: {exc}") from None
        return request
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise BadPayload(f"malformed OTLP protobuf: {exc}") from None
    return request


def _hex_ids_to_base64(payload: Any) -> None:
    """OTLP JSON writes trace/span ids as hex; protobuf's JSON mapping expects base64 for bytes."""
    for resource_spans in payload.get("resourceSpans", []) if isinstance(payload, dict) else []:
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if isinstance(span.get(key), str) and span[key]:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    value = getattr(any_value, kind)
    return value.hex() if kind == "bytes_value" else value


def attributes(key_values: Any) -> dict[str, Any]:
    """OTLP ``KeyValue`` list -> plain dict."""
    return {kv.key: _value(kv.value) for kv in key_values}


# ------------------------------------------------------------------ events


def is_request_span(name: str, attrs: Mapping[str, Any]) -> bool:
    return name == REQUEST_SPAN or "gen_ai.request.id" in attrs or any(k.startswith("gen_ai.latency.") for k in attrs)


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def request_span_events(span: Span, resource: Mapping[str, Any]) -> list[Event]:
    """The events of one vLLM request span (empty for any other span); see the module docstring."""
    attrs = attributes(span.attributes)
    if not is_request_span(span.name, attrs):
        return []
    start = span.start_time_unix_nano / 1e9
    end = span.end_time_unix_nano / 1e9 if span.end_time_unix_nano else None
    server: Any = resource.get(SERVER_ATTRIBUTE, resource.get("service.name"))
    if isinstance(server, str) and server.isdigit():
        server = int(server)
    common: Event = {
        "component": "vllm",
        "request_id": attrs.get("gen_ai.request.id"),
        "server": server,
        "trace_id": span.trace_id.hex(),
    }
    if isinstance(resource.get("vllm.process_id"), str) and resource["vllm.process_id"].isdigit():
        common["pid"] = int(resource["vllm.process_id"])
    fields = {field: attrs[key] for key, field in REQUEST_FIELDS.items() if key in attrs}
    reasons = attrs.get("gen_ai.response.finish_reasons")
    if isinstance(reasons, str):
        try:
            reasons = json.loads(reasons)
        except ValueError:
            reasons = [reasons]
    if reasons is not None:
        fields["finish_reasons"] = reasons
    e2e = _seconds(attrs.get("gen_ai.latency.e2e"))
    duration = end - start if end is not None else (e2e or 0.0)
    out: list[Event] = [{"kind": "inference.request", "start": start, "duration_s": duration, **common, **fields}]

    queue = _seconds(attrs.get("gen_ai.latency.time_in_queue"))
    prefill = _seconds(attrs.get("gen_ai.latency.time_in_model_prefill"))
    decode = _seconds(attrs.get("gen_ai.latency.time_in_model_decode"))
    ttft = _seconds(attrs.get("gen_ai.latency.time_to_first_token"))
    last_token = start + (e2e if e2e is not None else duration)
    # the first token: after ttft, else back from the last token (the span's end) by the decode time
    first_token = start + ttft if ttft is not None else last_token - (decode or 0.0)
    prefill_start = first_token - (prefill or 0.0)
    phases = [
        ("inference.queue", prefill_start - (queue or 0.0), queue),
        ("inference.prefill", prefill_start, prefill),
        ("inference.decode", first_token, decode),
    ]
    for kind, phase_start, length in phases:
        if length is not None:
            out.append({"kind": kind, "start": max(start, phase_start), "duration_s": max(0.0, length), **common})
    return out


def request_events(request: ExportTraceServiceRequest) -> list[Event]:
    """Every event of an export request (spans that are not vLLM request spans give none)."""
    out: list[Event] = []
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.extend(request_span_events(span, resource))
    return out


# ------------------------------------------------------------------ server


def create_app(handle: Callable[[ExportTraceServiceRequest], None], access_token: str | None = None) -> FastAPI:
    """The receiver's app: ``POST /v1/traces`` decodes the export and calls ``handle`` (``access_token``:
    the run token it asks for; None: open)."""
    from fastapi.responses import JSONResponse, Response
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    app = FastAPI(title="Telescope OTLP trace receiver")
    if access_token is not None:
        app.add_middleware(RunTokenMiddleware, token=access_token)

    @app.post(TRACES_PATH)
    async def traces(raw: Request) -> Response:
        content_type = raw.headers.get("content-type", "application/x-protobuf")
        try:
            request = decode_request(await raw.body(), content_type, raw.headers.get("content-encoding", ""))
        except BadPayload as exc:
            log.warning("OTLP receiver: dropped an export: %s", exc)
            return JSONResponse({"code": 3, "message": str(exc)}, status_code=400)
        handle(request)
        if "json" in content_type.lower():
            return JSONResponse({})
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf")

    return app


class OtlpTraceReceiver:
    """The receiver in a daemon thread of this process; events go to ``publish_event`` (the event bus).

    ``start`` binds ``host:port`` first (``port=0``: any free port), so a port in
    use raises :class:`OSError` at once. Counters: :attr:`spans` (request spans
    seen), :attr:`events` (events published), :attr:`exports` (POSTs accepted).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 4318,
        publish_event: Callable[[Mapping[str, Any]], None] = publish,
        access_token: str | None = None,
    ) -> None:
        self.host = host
        self.access_token = access_token
        self.requested_port = port
        self.publish_event = publish_event
        self.spans = 0
        self.events = 0
        self.exports = 0
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._socket is None:
            raise RuntimeError("the receiver is not started")
        return int(self._socket.getsockname()[1])

    def endpoint(self, advertised_host: str | None = None) -> str:
        """The URL a span exporter posts to (``advertised_host``: how other nodes reach this one)."""
        host = advertised_host or (self.host if self.host not in ("0.0.0.0", "::", "") else "127.0.0.1")
        return f"http://{host}:{self.port}{TRACES_PATH}"

    def handle(self, request: ExportTraceServiceRequest) -> None:
        produced = request_events(request)
        published = 0
        for event in produced:
            try:
                self.publish_event(event)
                published += 1
            except Exception as exc:  # a sink problem must not fail the exporter's POST
                log.debug("OTLP receiver: an event could not be published: %s", exc)
        with self._lock:
            self.exports += 1
            self.spans += sum(1 for e in produced if e["kind"] == "inference.request")
            self.events += published

    def start(self, timeout_s: float = 15.0) -> OtlpTraceReceiver:
        import uvicorn

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.requested_port))
        except OSError:
            sock.close()
            raise
        self._socket = sock
        config = uvicorn.Config(create_app(self.handle, self.access_token), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        server = self._server
        self._thread = threading.Thread(
            target=lambda: server.run(sockets=[sock]), name="telescope-otlp-receiver", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                self.stop()
                raise RuntimeError("the OTLP trace receiver did not start")
            time.sleep(0.01)
        log.info("OTLP trace receiver listening on %s:%d", self.host, self.port)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._server = None
