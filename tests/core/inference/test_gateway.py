"""The gateway driven by the real ``openai`` SDK, over the embedded engine on the tiny test model.

These run the whole path an agent program takes: the SDK's HTTP request, the gateway's
validation and chat rendering, the orchestrator's token-level client, the embedded
server and engine, and back. The tiny model is random, so these tests assert shapes and
token accounting, not what it says; the tool-call round trip with a chosen reply is in
test_gateway_tools.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from telescope.inference.client import InferenceClient
from telescope.inference.embedded.server import ServerThread
from telescope.inference.gateway.app import create_gateway_app
from telescope.inference.gateway.service import Gateway, GatewayCall

MESSAGES: list[Any] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "add 2 and 3"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "5"},
]
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]


class Recorder:
    def __init__(self) -> None:
        self.calls: list[GatewayCall] = []

    def __call__(self, call: GatewayCall) -> None:
        self.calls.append(call)


@pytest.fixture(scope="module")
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture(scope="module")
def gateways() -> list[Gateway]:
    """The gateway the app made at its start (one), for tests that hold its backend calls."""
    return []


@pytest.fixture(scope="module")
def gateway_url(
    server: ServerThread, tiny_model_path: Path, recorder: Recorder, gateways: list[Gateway]
) -> Iterator[str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)

    async def connect() -> Gateway:
        client = InferenceClient(server.base_url)
        gateway = await Gateway.connect(client, tokenizer, max_concurrent_requests=2, observers=[recorder])
        gateways.append(gateway)
        return gateway

    thread = ServerThread(create_gateway_app(connect), lifespan="on").start()
    yield thread.base_url + "/v1"
    thread.stop()


@pytest.fixture
def client(gateway_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway_url, api_key="unused", max_retries=0) as sdk:
        yield sdk


def model_of(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_models_lists_the_served_model(client: openai.OpenAI, tiny_model_path: Path) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [str(tiny_model_path)]
    assert models[0].model_extra is not None and models[0].model_extra["max_model_len"] == 512


def test_chat_with_every_role_and_tools(client: openai.OpenAI, recorder: Recorder) -> None:
    before = len(recorder.calls)
    reply = client.chat.completions.create(
        model=model_of(client),
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=6,
        n=2,
        seed=3,
        temperature=0.8,
        top_p=0.9,
        logprobs=True,
        top_logprobs=2,
    )
    assert reply.object == "chat.completion" and len(reply.choices) == 2
    call = recorder.calls[before]
    # the one call function saw the prompt and completion token ids the answer reports
    assert reply.usage is not None and reply.usage.prompt_tokens == len(call.prompt_token_ids)
    for choice, completion in zip(reply.choices, call.result.completions, strict=True):
        assert choice.logprobs is not None and choice.logprobs.content is not None
        assert [t.logprob for t in choice.logprobs.content] == completion.logprobs
        assert all(len(t.top_logprobs) <= 2 for t in choice.logprobs.content)
        assert choice.finish_reason in ("stop", "length", "tool_calls")
        assert completion.policy_version_start == 0
    assert reply.usage.completion_tokens == sum(len(c.token_ids) for c in call.result.completions)
    # the tools and the earlier call were rendered into the prompt by the model's template
    prompt_text = client.completions.create(model=model_of(client), prompt=call.prompt_token_ids, max_tokens=1)
    assert prompt_text.choices  # the prompt ids are a valid prompt for the backend too


def test_seeded_chat_is_repeatable(client: openai.OpenAI) -> None:
    ask: dict[str, Any] = {
        "model": model_of(client),
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "seed": 7,
    }
    first = client.chat.completions.create(**ask)
    again = client.chat.completions.create(**ask)
    assert first.choices[0].message.content == again.choices[0].message.content


def test_chat_stream_with_usage(client: openai.OpenAI) -> None:
    ask: dict[str, Any] = {
        "model": model_of(client),
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "seed": 1,
    }
    whole = client.chat.completions.create(**ask)
    chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_plain_and_streamed(client: openai.OpenAI) -> None:
    ask: dict[str, Any] = {
        "model": model_of(client),
        "prompt": "the answer is",
        "max_tokens": 5,
        "seed": 2,
        "logprobs": 1,
    }
    whole = client.completions.create(**ask)
    assert whole.choices[0].logprobs is not None and len(whole.choices[0].logprobs.token_logprobs or []) == 5
    chunks = list(client.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_async_client(gateway_url: str) -> None:
    async def go() -> list[str]:
        async with openai.AsyncOpenAI(base_url=gateway_url, api_key="unused", max_retries=0) as sdk:
            model = (await sdk.models.list()).data[0].id
            replies = await asyncio.gather(
                *(
                    sdk.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
                    for _ in range(2)
                )
            )
            return [r.choices[0].finish_reason for r in replies]

    assert len(asyncio.run(go())) == 2


def test_bad_field_is_a_400_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model_of(client), messages=[{"role": "robot", "content": "x"}])  # type: ignore[misc,list-item]  # a role OpenAI does not have, on purpose
    assert caught.value.status_code == 400 and caught.value.param == "messages[0].role"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model_of(client), messages=MESSAGES[:2], temperature=5)
    assert caught.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model_of(client), messages=MESSAGES[:2], logit_bias={"1": 5})
    assert caught.value.param == "logit_bias"


def test_unknown_model_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-9", messages=MESSAGES[:2])
    assert caught.value.param == "model" and "gpt-9" in caught.value.message


def test_prompt_over_the_context_is_a_400_with_the_limit(client: openai.OpenAI) -> None:
    long = " ".join(["the answer"] * 400)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model_of(client), messages=[{"role": "user", "content": long}])
    assert caught.value.code == "context_length_exceeded" and "512" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=model_of(client), prompt="hi", max_tokens=600)
    assert caught.value.param == "prompt" and "512" in caught.value.message


def test_saturated_gateway_answers_429(
    client: openai.OpenAI, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two calls held in flight fill the gateway (max_concurrent_requests=2): a third is refused at once.

    The backend calls are held by the test (not raced against the model's speed), then
    released: the two held calls complete.
    """
    model = model_of(client)
    [gateway] = gateways
    release = threading.Event()
    complete = gateway.client.complete

    async def held(*args: Any, **kwargs: Any) -> Any:
        await asyncio.to_thread(release.wait)
        return await complete(*args, **kwargs)

    monkeypatch.setattr(gateway.client, "complete", held)
    with ThreadPoolExecutor(2) as pool:
        calls = [pool.submit(client.completions.create, model=model, prompt="hi", max_tokens=4) for _ in range(2)]
        try:
            while gateway.in_flight < 2:  # both calls reached the backend (the test's timeout guards a hang)
                time.sleep(0.01)
            with pytest.raises(openai.RateLimitError) as refused:
                client.completions.create(model=model, prompt="hi", max_tokens=4)
        finally:
            release.set()
        assert refused.value.status_code == 429 and "saturated" in refused.value.message
        assert [len(call.result().choices) for call in calls] == [1, 1]


def test_the_docs_agent_runs(
    gateway_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/gateway.md's agent.py, as written, against the gateway (its reply is the random model's)."""
    import runpy

    page = (Path(__file__).resolve().parents[3] / "docs" / "gateway.md").read_text(encoding="utf-8")
    script = tmp_path / "agent.py"
    script.write_text(page.split("# file: agent.py\n", 1)[1].split("```", 1)[0], encoding="utf-8")
    monkeypatch.setenv("GATEWAY_URL", gateway_url)
    namespace = runpy.run_path(str(script))
    assert namespace["reply"].object == "chat.completion"
    assert capsys.readouterr().out.strip()
