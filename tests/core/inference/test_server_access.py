"""The embedded server with a run token: every route but ``/health`` asks for it; the client sends it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from inference_helpers import advance, idle_metrics, until_queued

from telescope.inference import weight_updates
from telescope.inference.client import InferenceClient, InferenceServerError
from telescope.inference.embedded.engine import Engine
from telescope.inference.embedded.server import ServerThread, create_app
from telescope.system.access import authorization_header
from telescope.transports.memory import MemoryTransport

TOKEN = "the-run-token"
COMPLETION = {"prompt": [5, 6, 7], "max_tokens": 2, "return_token_ids": True}
#: (method, path, JSON body) of every route the orchestrator's client calls but /health
ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/v1/completions", COMPLETION),
    ("POST", "/v1/completions/batch", {"requests": [COMPLETION]}),
    ("POST", "/collective_rpc", {"method": weight_updates.UPDATE_METHOD, "args": ["{}"]}),
    ("POST", "/collective_rpc", {"method": weight_updates.VERSION_METHOD, "args": []}),
    ("POST", "/abort_requests", {"request_ids": ["any"]}),
    ("POST", "/reset_prefix_cache", None),
    ("GET", "/metrics", None),
    ("GET", "/v1/models", None),
]


@pytest.fixture(scope="module")
def guarded(engine: Engine) -> Iterator[ServerThread]:
    srv = ServerThread(create_app(engine, access_token=TOKEN), host="127.0.0.1", port=0).start()
    yield srv
    srv.stop()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize("headers", [{}, authorization_header("a-wrong-token")], ids=["no token", "wrong token"])
def test_every_route_but_health_refuses_a_request_without_the_token(
    guarded: ServerThread, engine: Engine, headers: dict[str, str]
) -> None:
    before = engine.counts()
    with httpx.Client(base_url=guarded.base_url, timeout=30, headers=headers) as http:
        for method, path, body in ROUTES:
            response = http.request(method, path, json=body)
            assert response.status_code == 401, (method, path, response.text)
            assert response.json()["error"]["type"] == "AuthenticationError", path
            assert "vllm:" not in response.text and engine.settings.model_path not in response.text
        health = http.get("/health")
        assert health.status_code == 200 and health.content == b""  # up or down, nothing else
    after = engine.counts()
    assert after["requests_finished"] == before["requests_finished"]  # nothing was generated
    assert after["weight_updates"] == before["weight_updates"]


def test_a_client_without_the_token_is_refused_at_once(guarded: ServerThread) -> None:
    async def go() -> None:
        async with InferenceClient(guarded.base_url) as client:
            assert await client.health()  # the liveness probe is open
            for call in (client.complete([5, 6], max_tokens=2), client.metrics(), client.get_policy_version()):
                with pytest.raises(InferenceServerError) as refused:
                    await call
                assert refused.value.status == 401

    run(go())


@pytest.mark.parametrize("batch_requests", [True, False], ids=["batch route", "one POST per request"])
def test_the_client_with_the_token_generates_scrapes_and_aborts(
    guarded: ServerThread, engine: Engine, batch_requests: bool
) -> None:
    async def go() -> tuple[Any, dict[str, float], list[str], list[str], Any]:
        async with InferenceClient(guarded.base_url, access_token=TOKEN, batch_requests=batch_requests) as client:
            assert await client.health()
            models = await client.models()
            result = await client.complete([5, 6, 7], max_tokens=4, ignore_eos=True, seed=1)
            metrics = await client.metrics()
            with engine.paused():  # the request cannot finish before the abort
                running = asyncio.create_task(client.complete([5, 6], max_tokens=450, ignore_eos=True, request_id="ab"))
                await until_queued(engine)
                aborted = await client.abort(["ab"])
            return result, metrics, models, aborted, await running

    result, metrics, models, aborted, stopped = run(go())
    assert len(result.completions[0].token_ids) == 4 and models
    assert "vllm:num_requests_running" in metrics
    assert aborted == ["ab"] and stopped.completions[0].finish_reason == "abort"


def test_a_cancelled_request_is_still_aborted_through_the_check(guarded: ServerThread, engine: Engine) -> None:
    """The check passes the client's disconnect on to the route, which aborts the request in the engine."""

    async def go() -> tuple[dict[str, float], dict[str, float]]:
        async with InferenceClient(guarded.base_url, access_token=TOKEN, batch_requests=False) as client:
            before = await idle_metrics(client)
            with engine.paused():  # the request decodes, and cannot finish before the cancel
                task = asyncio.create_task(client.complete([5, 6], max_tokens=450, ignore_eos=True))
                await until_queued(engine)
                advance(engine, 3)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            return before, await idle_metrics(client)

    before, after = run(go())
    assert after["vllm:num_requests_running"] == 0
    assert after["telescope:requests_aborted_total"] - before["telescope:requests_aborted_total"] == 1
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 450


def test_weights_are_pushed_only_with_the_token(guarded: ServerThread, engine: Engine, tiny_model_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    weights = list(AutoModelForCausalLM.from_pretrained(str(tiny_model_path), dtype=torch.float32).state_dict().items())
    sender = MemoryTransport(None)
    info = sender.prepare_sender(num_receivers=1)
    start_version = engine.policy_version

    async def go() -> int:
        async with InferenceClient(guarded.base_url) as stranger:
            with pytest.raises(InferenceServerError, match="401"):
                await stranger.init_weight_transfer("memory", info, rank_offset=1)
        async with InferenceClient(guarded.base_url, access_token=TOKEN) as client:
            await client.init_weight_transfer("memory", info, rank_offset=1)
            send = asyncio.to_thread(sender.send, weights, start_version + 1)
            await asyncio.gather(send, client.update_weights(start_version + 1))
            return await client.get_policy_version()

    try:
        assert run(go()) == start_version + 1 == engine.policy_version
    finally:
        sender.close()
