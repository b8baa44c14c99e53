"""The OTLP trace receiver, fed by the OpenTelemetry SDK's own OTLP/HTTP exporter with vLLM-shaped spans."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from telescope.recording.otlp_receiver import OtlpTraceReceiver, decode_request
from telescope.recording.run_reader import RunReader
from telescope.recording.run_store import RunStore
from telescope.runtime.monitoring import start_trace_receiver

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

ARRIVAL = 1_700_000_000.25
#: The attributes vLLM's OutputProcessor.do_tracing sets on its "llm_request" span (vllm.tracing.SpanAttributes).
VLLM_ATTRIBUTES: dict[str, Any] = {
    "gen_ai.latency.time_to_first_token": 0.5,
    "gen_ai.latency.e2e": 1.75,
    "gen_ai.latency.time_in_queue": 0.1,
    "gen_ai.usage.prompt_tokens": 12,
    "gen_ai.usage.completion_tokens": 40,
    "gen_ai.latency.time_in_model_prefill": 0.3,
    "gen_ai.latency.time_in_model_decode": 1.2,
    "gen_ai.latency.time_in_model_inference": 1.5,
    "gen_ai.request.id": "cmpl-abc123-0",
    "gen_ai.response.finish_reasons": json.dumps(["stop"]),
    "gen_ai.request.max_tokens": 64,
    "gen_ai.request.temperature": 1.0,
    "gen_ai.request.n": 1,
}


@pytest.fixture
def receiver() -> Iterator[tuple[OtlpTraceReceiver, list[Mapping[str, Any]]]]:
    got: list[Mapping[str, Any]] = []
    started = OtlpTraceReceiver("127.0.0.1", 0, got.append).start()
    yield started, got
    started.stop()


Spans = list[tuple[str, float, float, dict[str, Any]]]


def export_with_the_sdk(endpoint: str, spans: Spans, gzip: bool = False) -> None:
    """Spans (name, start, end, attributes) through TracerProvider + SimpleSpanProcessor + OTLPSpanExporter."""
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import SpanKind

    # what vLLM's init_tracer puts in the resource, plus the tag the run sets through OTEL_RESOURCE_ATTRIBUTES
    resource = Resource.create(
        {"vllm.instrumenting_module_name": "vllm.llm_engine", "vllm.process_id": "4242", "telescope.server": "1"}
    )
    provider = TracerProvider(resource=resource)
    exporter = OTLPSpanExporter(endpoint=endpoint, compression=Compression.Gzip if gzip else Compression.NoCompression)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("vllm.llm_engine")
    for name, start, end, attrs in spans:
        span = tracer.start_span(name, kind=SpanKind.SERVER, start_time=int(start * 1e9), attributes=attrs)
        span.end(end_time=int(end * 1e9))
    assert provider.force_flush(10_000)
    provider.shutdown()


def by_kind(events: list[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {e["kind"]: e for e in events}


@pytest.mark.parametrize("gzip", [False, True])
def test_sdk_exported_vllm_span_becomes_request_and_phase_events(
    receiver: tuple[OtlpTraceReceiver, list[Mapping[str, Any]]], gzip: bool
) -> None:
    server, got = receiver
    export_with_the_sdk(server.endpoint(), [("llm_request", ARRIVAL, ARRIVAL + 1.75, VLLM_ATTRIBUTES)], gzip=gzip)
    events = by_kind(got)
    assert set(events) == {"inference.request", "inference.queue", "inference.prefill", "inference.decode"}
    for event in events.values():
        assert event["request_id"] == "cmpl-abc123-0" and event["server"] == 1 and event["component"] == "vllm"
        assert event["pid"] == 4242 and len(event["trace_id"]) == 32
    request = events["inference.request"]
    assert request["start"] == pytest.approx(ARRIVAL) and request["duration_s"] == pytest.approx(1.75)
    assert (request["prompt_tokens"], request["completion_tokens"]) == (12, 40)
    assert request["ttft_s"] == 0.5 and request["queue_s"] == 0.1 and request["e2e_s"] == 1.75
    assert request["finish_reasons"] == ["stop"] and request["max_tokens"] == 64
    # the first token at arrival + ttft: prefill ends there, decode starts there, the queue ends where prefill starts
    assert events["inference.prefill"]["start"] == pytest.approx(ARRIVAL + 0.5 - 0.3)
    assert events["inference.prefill"]["duration_s"] == pytest.approx(0.3)
    assert events["inference.queue"]["start"] == pytest.approx(ARRIVAL + 0.5 - 0.3 - 0.1)
    assert events["inference.queue"]["duration_s"] == pytest.approx(0.1)
    assert events["inference.decode"]["start"] == pytest.approx(ARRIVAL + 0.5)
    assert events["inference.decode"]["duration_s"] == pytest.approx(1.2)
    assert server.spans == 1 and server.events == 4


def test_other_spans_are_ignored_and_missing_phases_are_not_invented(
    receiver: tuple[OtlpTraceReceiver, list[Mapping[str, Any]]],
) -> None:
    server, got = receiver
    older_vllm = {"gen_ai.request.id": "r-2", "gen_ai.latency.time_in_queue": 0.05, "gen_ai.latency.e2e": 0.9}
    export_with_the_sdk(
        server.endpoint(),
        [
            ("load_weights", ARRIVAL, ARRIVAL + 3.0, {"code.function": "load"}),
            ("llm_request", ARRIVAL, ARRIVAL + 0.9, older_vllm),
        ],
    )
    assert sorted(e["kind"] for e in got) == ["inference.queue", "inference.request"]
    queue = by_kind(got)["inference.queue"]
    assert queue["request_id"] == "r-2" and queue["duration_s"] == pytest.approx(0.05)
    assert queue["start"] >= ARRIVAL  # placed back from the span's end, never before the arrival


def test_json_exports_and_bad_payloads(receiver: tuple[OtlpTraceReceiver, list[Mapping[str, Any]]]) -> None:
    server, got = receiver
    start_ns = int(ARRIVAL * 1e9)
    payload = {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "telescope.server", "value": {"stringValue": "0"}}]},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "name": "llm_request",
                                "startTimeUnixNano": str(start_ns),
                                "endTimeUnixNano": str(start_ns + 2_000_000_000),
                                "attributes": [
                                    {"key": "gen_ai.request.id", "value": {"stringValue": "j-1"}},
                                    {"key": "gen_ai.latency.time_to_first_token", "value": {"doubleValue": 0.4}},
                                    {"key": "gen_ai.latency.time_in_model_decode", "value": {"doubleValue": 1.5}},
                                    {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": "7"}},
                                ],
                            }
                        ]
                    }
                ],
            }
        ]
    }
    with httpx.Client(base_url=server.endpoint().rsplit("/v1/", 1)[0], timeout=10) as http:
        answer = http.post("/v1/traces", json=payload)
        assert answer.status_code == 200
        bad = http.post("/v1/traces", content=b"\x0a\xff\xff", headers={"content-type": "application/x-protobuf"})
        assert bad.status_code == 400
        wrong = http.post("/v1/traces", content=b"{}", headers={"content-encoding": "br"})
        assert wrong.status_code == 400
    events = by_kind(got)
    assert set(events) == {"inference.request", "inference.decode"}
    assert events["inference.request"]["trace_id"] == "5b8efff798038103d269b633813fc60c"
    assert events["inference.request"]["prompt_tokens"] == 7 and events["inference.request"]["server"] == 0
    assert events["inference.request"]["duration_s"] == pytest.approx(2.0)
    assert events["inference.decode"]["start"] == pytest.approx(ARRIVAL + 0.4)


def test_decode_request_reads_protobuf_and_otlp_json_ids() -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.name, span.trace_id = "llm_request", bytes(range(16))
    assert decode_request(request.SerializeToString()).resource_spans[0].scope_spans[0].spans[0].trace_id == bytes(
        range(16)
    )
    as_json = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": bytes(range(16)).hex(), "name": "x"}]}]}]}
    decoded = decode_request(json.dumps(as_json).encode(), "application/json")
    assert decoded.resource_spans[0].scope_spans[0].spans[0].trace_id == bytes(range(16))  # OTLP JSON: hex ids


def test_events_reach_the_run_store(tmp_path: Path) -> None:
    with RunStore(tmp_path) as store:
        store.capture_events()
        server = OtlpTraceReceiver("127.0.0.1", 0).start()  # the default publisher: the event bus
        try:
            export_with_the_sdk(server.endpoint(), [("llm_request", ARRIVAL, ARRIVAL + 1.75, VLLM_ATTRIBUTES)])
        finally:
            server.stop()
    kinds = sorted(e["kind"] for e in RunReader(tmp_path).events() if e["kind"].startswith("inference."))
    assert kinds == ["inference.decode", "inference.prefill", "inference.queue", "inference.request"]


def test_a_busy_port_moves_the_receiver_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            OtlpTraceReceiver("127.0.0.1", port).start()
        with caplog.at_level(logging.WARNING, logger="telescope.run.monitoring"):
            moved, endpoint = start_trace_receiver(port, multi_node=False)
    assert moved is not None and endpoint is not None
    try:
        assert moved.port != port and endpoint == f"http://127.0.0.1:{moved.port}/v1/traces"
        assert any(f"otlp_receiver_port {port} is not free" in r.getMessage() for r in caplog.records)
    finally:
        moved.stop()


def test_a_receiver_with_the_run_token_takes_exports_only_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's receiver asks for the run token; vLLM's exporter sends it from the environment the run gives it."""
    from telescope.api.context import InferenceContext
    from telescope.inference.vllm_backend import serve_env

    got: list[Mapping[str, Any]] = []
    server, endpoint = start_trace_receiver(0, multi_node=False, access_token="trace-token")
    assert server is not None and endpoint is not None
    server.publish_event = got.append
    try:
        assert endpoint.startswith("http://127.0.0.1:")  # one node: loopback
        refused = httpx.post(endpoint, content=b"", headers={"content-type": "application/x-protobuf"})
        assert refused.status_code == 401 and server.exports == 0
        context = InferenceContext(model="m", traces_endpoint=endpoint, access_token="trace-token")
        headers = serve_env(context, 0, base={})["OTEL_EXPORTER_OTLP_TRACES_HEADERS"]
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", headers)  # what the vLLM process gets
        export_with_the_sdk(endpoint, [("llm_request", ARRIVAL, ARRIVAL + 1.75, VLLM_ATTRIBUTES)])
    finally:
        server.stop()
    assert server.exports == 1 and "inference.request" in by_kind(got)
