"""The vLLM backend without vLLM: command line, environment, wire shapes, the worker extension."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import logging
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch

from telescope.api.context import InferenceContext
from telescope.config.composition import config_from_dict
from telescope.inference import weight_updates
from telescope.inference.client import (
    InferenceClient,
    InferenceServerError,
    build_completion_request,
    parse_completion_response,
)
from telescope.inference.plugin import VLLMSettings
from telescope.inference.protocol import CompletionRequest
from telescope.inference.vllm_backend import (
    EXTENSION_CLASS,
    TOKEN_MIDDLEWARE,
    TelescopeWorkerExtension,
    serve_command,
    serve_env,
    tracing_endpoint,
)
from telescope.schema.config import TelescopeConfig
from telescope.transports.memory import MemoryTransport

# A /v1/completions response as vLLM's CompletionResponse serialises it (return_token_ids=true, logprobs=0).
VLLM_RESPONSE: dict[str, Any] = {
    "id": "cmpl-8f2b4c",
    "object": "text_completion",
    "created": 1735000000,
    "model": "Qwen/Qwen2.5-0.5B",
    "choices": [
        {
            "index": 0,
            "text": " 42<|im_end|>",
            "logprobs": {
                "text_offset": [0, 3],
                "token_logprobs": [-0.25, -1.5],
                "tokens": [" 42", "<|im_end|>"],
                "top_logprobs": [{" 42": -0.25}, {"<|im_end|>": -1.5}],
            },
            "finish_reason": "stop",
            "stop_reason": None,
            "token_ids": [220, 151645],
            "prompt_logprobs": None,
            "prompt_token_ids": [151644, 872, 198],
        },
        {
            "index": 1,
            "text": " 7",
            "logprobs": {"text_offset": [0], "token_logprobs": [-2.0], "tokens": [" 7"], "top_logprobs": [None]},
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": [220],
            "prompt_logprobs": None,
            "prompt_token_ids": [151644, 872, 198],
        },
    ],
    "service_tier": None,
    "system_fingerprint": None,
    "usage": {"prompt_tokens": 3, "total_tokens": 6, "completion_tokens": 3, "prompt_tokens_details": None},
    "kv_transfer_params": None,
}


def _config(**overrides: Any) -> TelescopeConfig:
    base: dict[str, Any] = {
        "environments": [{"name": "countdown"}],
        "model": "Qwen/Qwen2.5-0.5B",
        "max_tokens": 64,
        "max_model_len": 2048,
        "seq_len": 2048,
    }
    base.update(overrides)
    return config_from_dict(base)


def test_serve_command_carries_every_inference_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # vLLM's tracing packages present
    config = _config(
        inference_tensor_parallel_size=2,
        inference_num_workers=4,
        gpu_memory_utilization=0.7,
        vllm_scheduling_policy="priority",
        enable_thinking=True,
        enable_vllm_tracing=True,
        otlp_receiver_port=4999,
        inference_host="0.0.0.0",
        inference_base_port=9000,
        model_dtype="bfloat16",
    )
    context, settings = InferenceContext.from_config(config), config.settings(VLLMSettings)
    context = dataclasses.replace(context, traces_endpoint="http://10.1.2.3:4999/v1/traces")  # the run's receiver
    cmd = serve_command(
        context, 1, settings, model_path="/models/q", chat_template_file="/tmp/t.jinja", executable="vllm"
    )
    assert cmd[:3] == ["vllm", "serve", "/models/q"]
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=False))
    assert flags["--port"] == "9001" and flags["--host"] == "0.0.0.0"
    assert flags["--tensor-parallel-size"] == "2" and flags["--gpu-memory-utilization"] == "0.7"
    assert flags["--max-model-len"] == "2048" and flags["--scheduling-policy"] == "priority"
    assert flags["--logprobs-mode"] == "processed_logprobs" and flags["--generation-config"] == "vllm"
    assert flags["--worker-extension-cls"] == EXTENSION_CLASS and flags["--dtype"] == "bfloat16"
    assert flags["--chat-template"] == "/tmp/t.jinja"
    assert json.loads(flags["--default-chat-template-kwargs"]) == {"enable_thinking": True}
    assert flags["--otlp-traces-endpoint"] == "http://10.1.2.3:4999/v1/traces"
    untraced = _config(enable_vllm_tracing=False)
    plain = serve_command(
        InferenceContext.from_config(untraced), 0, untraced.settings(VLLMSettings), model_path="m", executable="vllm"
    )
    assert "--otlp-traces-endpoint" not in plain and "--chat-template" not in plain
    assert "--default-chat-template-kwargs" not in plain


def _traced(endpoint: str | None = "http://10.0.0.9:4318/v1/traces") -> tuple[InferenceContext, VLLMSettings]:
    config = _config(enable_vllm_tracing=True)
    context = dataclasses.replace(InferenceContext.from_config(config), traces_endpoint=endpoint)
    return context, config.settings(VLLMSettings)


def test_tracing_flag_only_when_the_receiver_runs_and_vllm_can_export(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    present = {"opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http", "opentelemetry.exporter.otlp.proto.grpc"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in present else None)
    context, settings = _traced()
    with caplog.at_level(logging.WARNING, logger="telescope.inference.vllm_backend"):
        command = serve_command(context, 0, settings, model_path="m", executable="vllm")
    assert command[command.index("--otlp-traces-endpoint") + 1] == "http://10.0.0.9:4318/v1/traces"
    assert tracing_endpoint(context, settings) == context.traces_endpoint and not caplog.records

    present.discard("opentelemetry.exporter.otlp.proto.grpc")  # vLLM imports both exporters
    with caplog.at_level(logging.WARNING, logger="telescope.inference.vllm_backend"):
        command = serve_command(context, 0, settings, model_path="m", executable="vllm")
    assert "--otlp-traces-endpoint" not in command
    [warning] = caplog.records
    assert "opentelemetry-exporter-otlp-proto-grpc" in warning.getMessage()
    assert "pip install opentelemetry-sdk opentelemetry-exporter-otlp" in warning.getMessage()


def test_tracing_flag_needs_the_receiver(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    context, settings = _traced(endpoint=None)
    with caplog.at_level(logging.WARNING, logger="telescope.inference.vllm_backend"):
        assert "--otlp-traces-endpoint" not in serve_command(context, 0, settings, model_path="m", executable="vllm")
    assert "no trace receiver" in caplog.text and "otlp_receiver_port=4318" in caplog.text
    caplog.clear()
    untraced = settings.model_copy(update={"enable_vllm_tracing": False})
    assert tracing_endpoint(context, untraced) is None and not caplog.records  # off: no flag, no warning


def test_tracing_packages_missing_at_the_root_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_opentelemetry(name: str, *args: object) -> object:
        raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")  # find_spec of a missing parent

    monkeypatch.setattr(importlib.util, "find_spec", no_opentelemetry)
    assert tracing_endpoint(*_traced()) is None


def test_serve_env_points_the_exporter_at_the_receiver() -> None:
    context, _ = _traced()
    env = serve_env(context, 2, base={"OTEL_RESOURCE_ATTRIBUTES": "team=rl", "CUDA_VISIBLE_DEVICES": "0,1,2"})
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == "team=rl,telescope.server=2"
    plain = serve_env(dataclasses.replace(context, traces_endpoint=None), 0, base={})
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" not in plain and "OTEL_RESOURCE_ATTRIBUTES" not in plain


def test_vllm_asks_for_the_run_token_on_every_route_and_never_sees_it_on_its_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's own ``--api-key`` guards only paths under ``/v1``; the run's middleware guards the rest too
    (``/collective_rpc`` pushes weights). Built as vLLM's ``--middleware`` builds it: the class at that
    import path, with the token from the environment ``serve_env`` gives the process."""
    from opentelemetry.util.re import parse_env_headers
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from telescope.system.access import RUN_TOKEN_ENV, authorization_header

    token = "vllm-run-token"
    context, settings = _traced()
    context = dataclasses.replace(context, access_token=token)
    command = serve_command(context, 0, settings, model_path="m", executable="vllm")
    assert dict(zip(command[3::2], command[4::2], strict=False))["--middleware"] == TOKEN_MIDDLEWARE
    assert token not in " ".join(command) and "--api-key" not in command  # ps shows a command line to everyone
    env = serve_env(context, 0, base={})
    assert env[RUN_TOKEN_ENV] == env["VLLM_API_KEY"] == token
    headers = parse_env_headers(env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"], liberal=True)  # as vLLM's exporter reads
    assert headers == {"authorization": f"Bearer {token}"}  # the run's trace receiver asks for it too

    module, name = TOKEN_MIDDLEWARE.rsplit(".", 1)
    middleware = getattr(importlib.import_module(module), name)
    guarded = ("/collective_rpc", "/reset_prefix_cache", "/metrics", "/v1/completions")
    app = Starlette(
        routes=[Route(p, lambda _: PlainTextResponse("ok"), methods=["GET", "POST"]) for p in (*guarded, "/health")]
    )
    app.add_middleware(middleware)  # what vLLM does with a --middleware class
    monkeypatch.setenv(RUN_TOKEN_ENV, env[RUN_TOKEN_ENV])
    with TestClient(app) as client:
        for path in guarded:
            assert client.post(path).status_code == 401, path
            assert client.post(path, headers=authorization_header(token)).status_code == 200, path
        assert client.get("/health").status_code == 200

    plain = dataclasses.replace(context, access_token=None)
    assert "--middleware" not in serve_command(plain, 0, settings, model_path="m", executable="vllm")
    stale = serve_env(plain, 0, base={RUN_TOKEN_ENV: "old", "VLLM_API_KEY": "old"})
    assert RUN_TOKEN_ENV not in stale and "VLLM_API_KEY" not in stale


def test_serve_env_assigns_gpus_and_dev_mode() -> None:
    config = _config(inference_tensor_parallel_size=2, inference_num_workers=2)
    context = InferenceContext.from_config(config)
    env = serve_env(context, 1, base={})
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert serve_env(context, 1, base={"CUDA_VISIBLE_DEVICES": "4,5,6,7"})["CUDA_VISIBLE_DEVICES"] == "6,7"
    with pytest.raises(ValueError, match="needs GPUs"):
        serve_env(context, 1, base={"CUDA_VISIBLE_DEVICES": "0,1"})
    kept = serve_env(context, 1, base={"CUDA_VISIBLE_DEVICES": "3", "TELESCOPE_VLLM_KEEP_DEVICES": "1"})
    assert kept["CUDA_VISIBLE_DEVICES"] == "3"


def test_request_body_is_a_valid_vllm_completion_request() -> None:
    body = build_completion_request(
        [1, 2, 3],
        model="m",
        max_tokens=8,
        temperature=0.6,
        top_p=0.9,
        n=4,
        stop=["</answer>"],
        seed=7,
        priority=2,
        request_id="r1",
    )
    assert body["return_token_ids"] is True and body["logprobs"] == 0 and body["prompt"] == [1, 2, 3]
    parsed = CompletionRequest.model_validate(body)
    assert parsed.priority == 2 and parsed.stop_strings == ["</answer>"] and parsed.request_id == "r1"


def test_parse_vllm_response_fills_versions_from_the_client() -> None:
    result = parse_completion_response(VLLM_RESPONSE, dispatch_version=3, known_version=4)
    first, second = result.completions
    assert result.prompt_token_ids == [151644, 872, 198]
    assert first.token_ids == [220, 151645] and first.logprobs == [-0.25, -1.5] and first.finish_reason == "stop"
    assert second.finish_reason == "length" and second.token_ids == [220]
    assert first.policy_version_start == 3 and first.policy_version_end == 4 and first.token_policy_versions is None
    assert parse_completion_response(json.dumps(VLLM_RESPONSE).encode(), 3, 4) == result  # the body, parsed in one pass
    broken = json.loads(json.dumps(VLLM_RESPONSE))
    broken["choices"][0]["token_ids"] = None
    with pytest.raises(InferenceServerError, match="return_token_ids"):
        parse_completion_response(broken, 0, 0)


def test_client_against_vllm_shaped_server() -> None:
    """The one client drives a server answering like `vllm serve` (TP=2: two collective_rpc results)."""
    seen: list[tuple[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body: Any = json.loads(request.content) if request.content else {}
        seen.append((request.url.path, body))
        if request.url.path == "/v1/completions":
            return httpx.Response(200, json=VLLM_RESPONSE)
        if request.url.path == "/collective_rpc":
            if body["method"] == weight_updates.UPDATE_METHOD:
                version = json.loads(body["args"][0])["version"]
                return httpx.Response(200, json={"results": [{"policy_version": version}] * 2})
            return httpx.Response(200, json={"results": [{"rank": 1}, {"rank": 2}]})
        if request.url.path == "/reset_prefix_cache":
            return httpx.Response(200)
        if request.url.path == "/abort_requests":
            return httpx.Response(404, json={"detail": "Not Found"})
        return httpx.Response(404)

    async def go() -> Any:
        client = InferenceClient("http://vllm.test", http_transport=httpx.MockTransport(handler))
        async with client:
            init = await client.init_weight_transfer("nccl", {"host": "h", "port": 1, "world_size": 3}, 1)
            first = await client.complete([1, 2], max_tokens=2)
            update = await client.update_weights(5)
            second = await client.complete([1, 2], max_tokens=2)
            aborted = await client.abort(["x"])
            return init, first, update, second, aborted

    init, first, update, second, aborted = asyncio.run(go())
    assert [r["rank"] for r in init] == [1, 2] and len(update) == 2 and aborted == []
    assert first.completions[0].policy_version_start == 0 and second.completions[0].policy_version_start == 5
    paths = [p for p, _ in seen]
    assert paths.index("/reset_prefix_cache") == paths.index("/collective_rpc", 1) + 1
    rpc = next(b for p, b in seen if p == "/collective_rpc")
    assert rpc["method"] == weight_updates.INIT_METHOD and all(isinstance(a, str) for a in rpc["args"])


class _FakeModel:
    def __init__(self) -> None:
        self.loaded: dict[str, torch.Tensor] = {}

    def load_weights(self, weights: Any) -> set[str]:
        for name, tensor in weights:
            self.loaded[name] = tensor.clone()
        return set(self.loaded)


class _FakeWorker(TelescopeWorkerExtension):
    """Stands in for vLLM's GPU worker: the attributes the extension relies on."""

    def __init__(self, rank: int) -> None:
        self.device = torch.device("cpu")
        self.rank = rank
        self.model_runner = SimpleNamespace(model=_FakeModel())


def test_worker_extension_receives_and_loads_in_place() -> None:
    sender = MemoryTransport()
    info = sender.prepare_sender(num_receivers=2)
    workers = [_FakeWorker(rank) for rank in (0, 1)]
    try:
        payload = weight_updates.init_payload("memory", info, rank_offset=3)
        assert [w.telescope_init_weight_transfer(payload)["rank"] for w in workers] == [3, 4]
        weights = [("model.layers.0.mlp.up_proj.weight", torch.randn(4, 2)), ("lm_head.weight", torch.ones(3))]
        sender.send(weights, version=2)
        for worker in workers:
            result = worker.telescope_update_weights(weight_updates.update_payload(2))
            assert result["policy_version"] == 2 and result["num_tensors"] == 2
            loaded = worker.model_runner.model.loaded
            assert torch.equal(loaded["model.layers.0.mlp.up_proj.weight"], weights[0][1])
            assert worker.telescope_policy_version() == {"policy_version": 2}
    finally:
        sender.close()
    with pytest.raises(RuntimeError, match="before"):
        _FakeWorker(0).telescope_update_weights(weight_updates.update_payload(1))


def test_a_held_worker_takes_part_in_the_transfer_and_keeps_its_weights() -> None:
    """``load: false`` (an eval server mid-eval): the version is received and dropped, nothing is loaded."""
    sender = MemoryTransport()
    info = sender.prepare_sender(num_receivers=1)
    worker = _FakeWorker(0)
    try:
        worker.telescope_init_weight_transfer(weight_updates.init_payload("memory", info, rank_offset=1))
        sender.send([("lm_head.weight", torch.ones(3))], version=1)
        worker.telescope_update_weights(weight_updates.update_payload(1))
        sender.send([("lm_head.weight", torch.zeros(3))], version=2)
        held = worker.telescope_update_weights(weight_updates.update_payload(2, load=False))
        assert held["policy_version"] == 1 and held["num_tensors"] == 1
        assert torch.equal(worker.model_runner.model.loaded["lm_head.weight"], torch.ones(3))
        assert worker.telescope_policy_version() == {"policy_version": 1}
    finally:
        sender.close()
