"""The embedded HTTP server driven by the orchestrator's client: API shape, abort, multi-turn, weight updates."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from inference_helpers import advance, idle_metrics, mean_k3, trainer_logprobs, until_queued

from telescope.api import events
from telescope.inference.client import InferenceClient, InferenceServerError
from telescope.inference.embedded.engine import Engine
from telescope.inference.embedded.server import ServerThread
from telescope.transports.memory import MemoryTransport


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_health_models_and_metrics(server: ServerThread, engine: Engine) -> None:
    async def go() -> tuple[bool, list[str], dict[str, float]]:
        async with InferenceClient(server.base_url) as client:
            return await client.health(), await client.models(), await client.metrics()

    healthy, models, metrics = run(go())
    assert healthy and models == [engine.settings.model_path]
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:generation_tokens_total",
        "telescope:policy_version",
    ):
        assert name in metrics


def test_completion_response_has_vllm_shape(server: ServerThread, engine: Engine) -> None:
    body = {
        "prompt": [5, 6, 7],
        "max_tokens": 5,
        "logprobs": 1,
        "return_token_ids": True,
        "seed": 1,
        "temperature": 1.0,
        "n": 2,
        "some_vllm_only_field": True,
    }
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        payload = http.post("/v1/completions", json=body).json()
        assert payload["object"] == "text_completion"
        assert set(payload["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens"}
        choice = payload["choices"][0]
        assert choice["prompt_token_ids"] == [5, 6, 7] and len(choice["token_ids"]) == 5
        assert set(choice["logprobs"]) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
        assert len(choice["logprobs"]["top_logprobs"][0]) >= 1 and choice["finish_reason"] in ("stop", "length")
        for choice in payload["choices"]:  # every token named as it decodes alone (vLLM's names), offsets add up
            logprobs = choice["logprobs"]
            assert logprobs["tokens"] == [engine.tokenizer.decode([t]) for t in choice["token_ids"]]
            assert logprobs["text_offset"] == [sum(map(len, logprobs["tokens"][:i])) for i in range(5)]
            for name, top in zip(logprobs["tokens"], logprobs["top_logprobs"], strict=True):
                assert name in top
        plain = http.post("/v1/completions", json={"prompt": "the answer", "max_tokens": 3}).json()
        assert plain["choices"][0]["token_ids"] is None and plain["choices"][0]["logprobs"] is None
        too_long = http.post("/v1/completions", json={"prompt": [1] * 510, "max_tokens": 10})
        assert too_long.status_code == 400 and "maximum context length" in too_long.json()["error"]["message"]
        prio = http.post("/v1/completions", json={"prompt": [1], "max_tokens": 1, "priority": 3})
        assert prio.status_code == 400
        assert http.post("/v1/completions", json={"prompt": [[1], [2]], "max_tokens": 1}).status_code == 422


def test_client_completion_with_token_ids_and_logprobs(server: ServerThread, engine: Engine) -> None:
    async def go() -> Any:
        async with InferenceClient(server.base_url) as client:
            return await client.complete([40, 41, 42], max_tokens=12, temperature=0.7, n=2, seed=4, ignore_eos=True)

    result = run(go())
    assert result.prompt_token_ids == [40, 41, 42] and len(result.completions) == 2
    for c in result.completions:
        ref = trainer_logprobs(engine.model, [40, 41, 42], c.token_ids, 0.7)
        assert mean_k3(c.logprobs, ref) < 1e-3
        assert c.policy_version_start == c.policy_version_end == engine.policy_version
        assert c.token_policy_versions == [engine.policy_version] * 12


def test_multi_turn_continuation_is_extended_exactly(server: ServerThread, engine: Engine) -> None:
    """Turn 2's prompt is turn 1's ids + the model's ids + the environment's ids, used as given."""

    async def go() -> tuple[Any, Any, list[int]]:
        async with InferenceClient(server.base_url) as client:
            first = await client.complete([50, 51, 52], max_tokens=10, seed=1, ignore_eos=True)
            turn1 = first.completions[0]
            # ids a re-tokenisation of the decoded text would not reproduce (a merge split on purpose)
            env_reply = [2, 1, 60, 61, 62, 2, 1]
            history = first.prompt_token_ids + turn1.token_ids + env_reply
            second = await client.complete(history, max_tokens=10, seed=2, ignore_eos=True)
            return first, second, history

    first, second, history = run(go())
    assert second.prompt_token_ids == history
    turn2 = second.completions[0]
    ref = trainer_logprobs(engine.model, history, turn2.token_ids, 1.0)
    assert mean_k3(turn2.logprobs, ref) < 1e-3
    assert first.completions[0].token_ids == history[3:13]


def test_cancelling_the_client_aborts_the_request(server: ServerThread, engine: Engine) -> None:
    async def go() -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        async with InferenceClient(server.base_url) as client:
            before = await idle_metrics(client)
            with engine.paused():  # the request decodes, and cannot finish before the cancel
                task = asyncio.create_task(client.complete([5, 6], max_tokens=400, ignore_eos=True))
                await until_queued(engine)
                advance(engine, 3)
                during = await client.metrics()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            return before, during, await idle_metrics(client)

    before, during, after = run(go())
    assert during["vllm:num_requests_running"] >= 1
    assert after["vllm:num_requests_running"] == 0
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < 400, "generation must stop early"
    assert after["telescope:requests_aborted_total"] - before["telescope:requests_aborted_total"] == 1


def test_abort_route(server: ServerThread, engine: Engine) -> None:
    async def go() -> tuple[Any, list[str]]:
        async with InferenceClient(server.base_url) as client:
            with engine.paused():
                task = asyncio.create_task(
                    client.complete([5, 6], max_tokens=450, ignore_eos=True, request_id="to-abort")
                )
                await until_queued(engine)
                aborted = await client.abort(["to-abort", "unknown"])
            return await task, aborted

    result, aborted = run(go())
    assert aborted == ["to-abort"]
    assert result.completions[0].finish_reason == "abort" and len(result.completions[0].token_ids) < 450


def test_weight_update_through_memory_transport(server: ServerThread, engine: Engine, tiny_model_path: Path) -> None:
    """The trainer publishes new weights; the server loads them in place and its logprobs follow them."""
    from transformers import AutoModelForCausalLM

    trainer = AutoModelForCausalLM.from_pretrained(str(tiny_model_path), dtype=torch.float32).eval()
    original = {k: v.clone() for k, v in trainer.state_dict().items()}
    torch.manual_seed(0)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    sender = MemoryTransport(None)
    info = sender.prepare_sender(num_receivers=1)
    prompt = [40, 41, 42, 43]

    async def go() -> tuple[Any, Any, Any, int]:
        async with InferenceClient(server.base_url, server_index=0) as client:
            before = await client.complete(prompt, max_tokens=16, seed=3, ignore_eos=True)
            await client.init_weight_transfer("memory", info, rank_offset=1)
            inflight = asyncio.create_task(client.complete(prompt, max_tokens=300, seed=5, ignore_eos=True))
            await asyncio.sleep(0.1)
            send = asyncio.to_thread(sender.send, list(trainer.state_dict().items()), 1)
            results = await asyncio.gather(send, client.update_weights(1))
            after = await client.complete(prompt, max_tokens=16, seed=3, ignore_eos=True)
            return before, after, await inflight, results[1][0]["policy_version"]

    seen: list[dict[str, Any]] = []
    unsubscribe = events.subscribe(seen.append)
    try:
        started = time.time()
        before, after, inflight, version = run(go())
        assert version == 1 and engine.policy_version == 1
        [load] = [e for e in seen if e["kind"] == "weights.load"]  # one per server worker, with its own timing
        assert (load["server"], load["worker"], load["version"]) == (0, 0, 1)
        assert load["tensors"] == len(trainer.state_dict()) and load["duration_s"] > 0
        assert started <= load["start"] <= time.time() and load["component"] == "inference"
        old_tokens = before.completions[0]
        new_ref_on_old = trainer_logprobs(trainer, prompt, old_tokens.token_ids, 1.0)
        assert mean_k3(old_tokens.logprobs, new_ref_on_old) > 1e-2, "the update must change the distribution"
        c = after.completions[0]
        assert c.policy_version_start == c.policy_version_end == 1
        assert mean_k3(c.logprobs, trainer_logprobs(trainer, prompt, c.token_ids, 1.0)) < 1e-3
        versions = inflight.completions[0].token_policy_versions
        assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions)
        assert inflight.completions[0].policy_version_start == 0 and inflight.completions[0].policy_version_end == 1
    finally:
        unsubscribe()
        engine.update_weights(list(original.items()), version=0)
        sender.close()


def test_a_held_server_keeps_its_weights_through_an_update(server: ServerThread, engine: Engine) -> None:
    """``update_weights(v, load=False)``: the server takes part in the transfer, keeps serving its version."""
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    sender = MemoryTransport(None)
    info = sender.prepare_sender(num_receivers=1)
    changed = {k: v + 1.0 for k, v in original.items()}

    async def go() -> tuple[Any, Any]:
        async with InferenceClient(server.base_url, server_index=0) as client:
            await client.init_weight_transfer("memory", info, rank_offset=1)
            send = asyncio.to_thread(sender.send, list(changed.items()), 1)
            results = await asyncio.gather(send, client.update_weights(1, load=False))
            after = await client.complete([40, 41], max_tokens=4, seed=1, ignore_eos=True)
            return results[1][0], after

    seen: list[dict[str, Any]] = []
    unsubscribe = events.subscribe(seen.append)
    try:
        result, after = run(go())
        assert result["policy_version"] == 0 and engine.policy_version == 0
        assert all(torch.equal(v, original[k]) for k, v in engine.model.state_dict().items())
        assert after.completions[0].policy_version_start == after.completions[0].policy_version_end == 0
        [hold] = [e for e in seen if e["kind"].startswith("weights.")]
        assert (hold["kind"], hold["version"], hold["held_version"]) == ("weights.hold", 1, 0)
    finally:
        unsubscribe()
        engine.update_weights(list(original.items()), version=0)
        sender.close()


def test_unknown_rpc_method_is_rejected(server: ServerThread) -> None:
    async def go() -> None:
        async with InferenceClient(server.base_url) as client:
            await client.collective_rpc("shutdown_everything", "{}")

    with pytest.raises(InferenceServerError, match="unknown method"):
        run(go())


def test_requests_are_timeline_events_with_the_server_phases(server: ServerThread, engine: Engine) -> None:
    """One ``inference.request`` per request (ids from the event context), and queue, prefill and decode phases."""
    seen: list[dict[str, Any]] = []

    async def go() -> None:
        async with InferenceClient(server.base_url, server_index=3) as client:
            with events.context(group_id=7, sample_id="q1", turn=0):
                await client.complete([40, 41, 42], max_tokens=6, seed=1, ignore_eos=True, request_id="r-ok")
            with engine.paused():  # the request cannot finish before the client gives up on it
                task = asyncio.create_task(
                    client.complete([5, 6], max_tokens=450, ignore_eos=True, request_id="r-gone")
                )
                await until_queued(engine)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

    unsubscribe = events.subscribe(seen.append)
    try:
        run(go())
    finally:
        unsubscribe()
    by_request: dict[str, dict[str, dict[str, Any]]] = {}
    for event in seen:
        by_request.setdefault(event["request_id"], {})[event["kind"]] = event
    ok = by_request["r-ok"]
    assert set(ok) == {"inference.request", "inference.queue", "inference.prefill", "inference.decode"}
    request = ok["inference.request"]
    assert (request["server"], request["group_id"], request["sample_id"], request["turn"]) == (3, 7, "q1", 0)
    assert request["component"] == "inference" and request["aborted"] is False
    assert (request["prompt_tokens"], request["completion_tokens"], request["finish_reason"]) == (3, 6, "length")
    assert request["policy_version_start"] == request["policy_version_end"] == 0
    queue, prefill, decode = ok["inference.queue"], ok["inference.prefill"], ok["inference.decode"]
    assert all(e["server"] == 3 and e["sample_id"] == "q1" for e in (queue, prefill, decode))
    assert queue["start"] + queue["duration_s"] == pytest.approx(prefill["start"])
    assert prefill["start"] + prefill["duration_s"] == pytest.approx(decode["start"])
    assert prefill["duration_s"] > 0 and decode["duration_s"] > 0
    # the server's phases lie within the client's view of the request (one clock here)
    assert request["start"] <= queue["start"] + 0.01
    assert decode["start"] + decode["duration_s"] <= request["start"] + request["duration_s"] + 0.01
    gone = by_request["r-gone"]
    assert set(gone) == {"inference.request"}  # aborted by disconnect: no response, no server phases
    assert gone["inference.request"]["aborted"] is True and gone["inference.request"]["finish_reason"] == "aborted"
    assert "group_id" not in gone["inference.request"]


def test_engine_steps_and_batched_tokens_count_every_forward(server: ServerThread) -> None:
    """A lone request of 3 prompt tokens and 6 new ones: one prefill step then 5 decode steps, 8 tokens through
    the model (the last sampled token is never fed); two such requests together batch into the same steps."""

    async def go() -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        async with InferenceClient(server.base_url) as client:
            before = await idle_metrics(client)  # the previous test's aborted request may still take a step
            await client.complete([5, 6, 7], max_tokens=6, ignore_eos=True, seed=1)
            alone = await client.metrics()
            await client.complete([5, 6, 7], max_tokens=6, ignore_eos=True, seed=2, n=2)
            return before, alone, await client.metrics()

    before, alone, together = run(go())
    assert alone["telescope:engine_steps_total"] - before["telescope:engine_steps_total"] == 6
    assert alone["telescope:batched_tokens_total"] - before["telescope:batched_tokens_total"] == 3 + 5
    assert together["telescope:engine_steps_total"] - alone["telescope:engine_steps_total"] == 6
    assert together["telescope:batched_tokens_total"] - alone["telescope:batched_tokens_total"] == 3 + 2 * 5


def test_batch_route_answers_each_request_on_its_own_line(server: ServerThread, engine: Engine) -> None:
    """Each request of a batch is its own engine request: its own id, seed and finish; a refused one gets
    its error line and the others still run; the same seed gives the single route's tokens."""
    short = {
        "prompt": [5, 6, 7],
        "max_tokens": 2,
        "ignore_eos": True,
        "seed": 3,
        "return_token_ids": True,
        "logprobs": 0,
        "request_id": "short",
    }
    long = {**short, "max_tokens": 12, "seed": 4, "request_id": "long"}
    wrong_model = {**short, "model": "no-such-model", "request_id": "refused"}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        answer = http.post("/v1/completions/batch", json={"requests": [long, wrong_model, short]})
        single = http.post("/v1/completions", json={**long, "request_id": "single"}).json()
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in answer.text.splitlines()]
    assert [line["index"] for line in lines] == [1, 2, 0]  # the refusal at once, then in finishing order
    assert lines[0]["status"] == 404 and "no-such-model" in lines[0]["error"] and lines[0]["response"] is None
    by_index = {line["index"]: line["response"] for line in lines[1:]}
    assert by_index[0]["id"] == "long" and by_index[2]["id"] == "short"
    assert len(by_index[0]["choices"][0]["token_ids"]) == 12 and len(by_index[2]["choices"][0]["token_ids"]) == 2
    assert by_index[0]["choices"][0]["token_ids"] == single["choices"][0]["token_ids"]
    assert by_index[0]["timing"]["finished"] >= by_index[2]["timing"]["finished"]
