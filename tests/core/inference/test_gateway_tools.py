"""Tool calls: the hermes parser on constructed text, and the round trip with a chosen reply.

The tiny model is random, so it cannot be made to write a tool call. The round trip
uses a backend that answers chosen token ids (the tokens of a ``<tool_call>`` block) in
the embedded engine's response shape, through the real :class:`InferenceClient` (an
``httpx.MockTransport`` in place of the network): it proves the gateway renders the
tools into the prompt with the model's template, and parses the completion's text into
``tool_calls`` that the ``openai`` SDK reads, including a forced ``tool_choice``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from telescope.inference.client import InferenceClient
from telescope.inference.embedded.server import ServerThread
from telescope.inference.gateway.app import create_gateway_app
from telescope.inference.gateway.service import Gateway
from telescope.inference.gateway.tool_parsers import parse_hermes

TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
]


def test_hermes_parser_reads_calls_and_keeps_the_rest() -> None:
    text = 'let me add <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n'
    text += '<tool_call>{"name": "neg"}</tool_call>'
    parsed = parse_hermes(text)
    assert parsed.content == "let me add"
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("add", {"a": 1}), ("neg", {})]
    broken = "<tool_call>{not json}</tool_call>"
    assert parse_hermes(broken).content == broken and not parse_hermes(broken).tool_calls


class ChosenReplies:
    """A backend answering every completion with the tokens of ``self.reply``; keeps the prompts it got."""

    def __init__(self, tokenizer: Any, model: str) -> None:
        self.tokenizer = tokenizer
        self.model = model
        self.reply = ""
        self.prompts: list[list[int]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": self.model, "max_model_len": 512}]})
        body = json.loads(request.content)
        self.prompts.append(body["prompt"])
        ids = self.tokenizer(self.reply, add_special_tokens=False)["input_ids"]
        choice = {
            "index": 0,
            "text": self.reply,
            "token_ids": ids,
            "prompt_token_ids": body["prompt"],
            "finish_reason": "stop",
            "logprobs": {"token_logprobs": [-0.5] * len(ids)},
        }
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)}
        return httpx.Response(200, json={"model": self.model, "choices": [choice], "usage": usage})


@pytest.fixture(scope="module")
def backend(tiny_model_path: Path) -> ChosenReplies:
    from transformers import AutoTokenizer

    return ChosenReplies(AutoTokenizer.from_pretrained(tiny_model_path), "tiny")


@pytest.fixture(scope="module")
def sdk(backend: ChosenReplies) -> Iterator[openai.OpenAI]:
    async def connect() -> Gateway:
        client = InferenceClient("http://backend", http_transport=httpx.MockTransport(backend.handle))
        return await Gateway.connect(client, backend.tokenizer)

    thread = ServerThread(create_gateway_app(connect, api_key="secret"), lifespan="on").start()
    with openai.OpenAI(base_url=thread.base_url + "/v1", api_key="secret", max_retries=0) as client:
        yield client
    thread.stop()


def test_reply_with_a_tool_call_becomes_tool_calls(sdk: openai.OpenAI, backend: ChosenReplies) -> None:
    backend.reply = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    messages: list[Any] = [{"role": "user", "content": "add 2 and 3"}]
    reply = sdk.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("add", {"a": 2, "b": 3})]  # type: ignore[union-attr]
    prompt = backend.tokenizer.decode(backend.prompts[-1])
    assert '"name": "add"' in prompt and prompt.endswith("<|im_start|>assistant\n")
    streamed = list(sdk.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, stream=True))
    deltas = [d for c in streamed for d in c.choices[0].delta.tool_calls or []]
    assert [d.function.name for d in deltas if d.function] == ["add"]
    assert streamed[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_renders_no_tools_and_parses_nothing(sdk: openai.OpenAI, backend: ChosenReplies) -> None:
    backend.reply = '<tool_call>{"name": "add", "arguments": {}}</tool_call>'
    reply = sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], tools=TOOLS, tool_choice="none"
    )
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].message.content == backend.reply
    assert "<tools>" not in backend.tokenizer.decode(backend.prompts[-1])


def test_named_tool_choice_puts_the_call_in_the_models_mouth(sdk: openai.OpenAI, backend: ChosenReplies) -> None:
    backend.reply = '{"a": 1}}</tool_call>'  # what the model writes after the forced prefix
    reply = sdk.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "x"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}},
    )
    calls = reply.choices[0].message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in calls] == [("add", '{"a": 1}')]  # type: ignore[union-attr]
    assert backend.tokenizer.decode(backend.prompts[-1]).endswith('<tool_call>{"name": "add", "arguments": ')


def test_api_key_is_required_when_set(sdk: openai.OpenAI) -> None:
    intruder = openai.OpenAI(base_url=str(sdk.base_url), api_key="wrong", max_retries=0)
    with intruder, pytest.raises(openai.AuthenticationError):
        intruder.models.list()
    assert sdk.models.list().data[0].id == "tiny"


def test_a_backend_that_cannot_answer_is_a_503(backend: ChosenReplies) -> None:
    """The backend answers 503 to every completion (after the client's retries): the SDK sees a 503."""

    def overloaded(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return backend.handle(request)
        return httpx.Response(503, text="engine overloaded\nTraceback (most recent call last): ...")

    async def connect() -> Gateway:
        client = InferenceClient("http://backend", http_transport=httpx.MockTransport(overloaded), max_retries=1)
        return await Gateway.connect(client, backend.tokenizer)

    thread = ServerThread(create_gateway_app(connect), lifespan="on").start()
    try:
        client = openai.OpenAI(base_url=thread.base_url + "/v1", api_key="x", max_retries=0)
        with client, pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    finally:
        thread.stop()
    assert caught.value.status_code == 503 and "Traceback" not in caught.value.message
