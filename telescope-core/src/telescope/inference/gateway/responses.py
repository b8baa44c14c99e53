"""OpenAI response bodies, whole or as server-sent-event chunks, from a finished completion.

Streaming limit: the token-level backends answer whole completions, so a streamed
reply is sent once generation has finished: per choice, a chunk with the role, one with
the whole content (and its log-probabilities), one with the tool calls, one with the
finish reason; then, with ``stream_options.include_usage``, a chunk holding only the
usage; then ``data: [DONE]``. A client sees the shape of an OpenAI stream, not tokens as
they are generated. An error is known before the first byte and answered with its
status, never inside a stream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

from telescope.inference.client import Completion, CompletionResult
from telescope.inference.gateway.service import Gateway
from telescope.inference.gateway.tool_parsers import ParsedReply
from telescope.inference.protocol import new_request_id


def usage(result: CompletionResult) -> dict[str, int]:
    completion = sum(len(c.token_ids) for c in result.completions)
    prompt = len(result.prompt_token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _top(completion: Completion, position: int, count: int) -> list[tuple[str, float]]:
    tops = completion.top_logprobs[position] if completion.top_logprobs else None
    return sorted((tops or {}).items(), key=lambda item: -item[1])[:count]


def chat_logprobs(gateway: Gateway, completion: Completion, top_logprobs: int) -> dict[str, Any]:
    """``choices[i].logprobs`` of a chat completion: each token, its log-probability and alternatives."""
    content = []
    for position, (token_id, logprob) in enumerate(zip(completion.token_ids, completion.logprobs, strict=True)):
        token = gateway.token_text(token_id)
        alternatives = [
            {"token": text, "logprob": value, "bytes": list(text.encode())}
            for text, value in _top(completion, position, top_logprobs)
        ]
        content.append(
            {"token": token, "logprob": logprob, "bytes": list(token.encode()), "top_logprobs": alternatives}
        )
    return {"content": content, "refusal": None}


def finish_reason(completion: Completion, reply: ParsedReply) -> str:
    if reply.tool_calls:
        return "tool_calls"
    return "length" if completion.finish_reason == "length" else "stop"


def chat_message(reply: ParsedReply) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": (reply.content or None) if reply.tool_calls else reply.content,
    }
    if reply.tool_calls:
        message["tool_calls"] = [call.to_openai() for call in reply.tool_calls]
    return message


class ChatAnswer:
    """A finished chat completion: its replies, and the body or the stream that carries them."""

    def __init__(
        self, gateway: Gateway, result: CompletionResult, replies: list[ParsedReply], top_logprobs: int | None
    ):
        self.gateway = gateway
        self.result = result
        self.replies = replies
        self.top_logprobs = top_logprobs  # None: log-probabilities not asked for
        self.id = "chatcmpl-" + new_request_id().removeprefix("cmpl-")
        self.created = int(time.time())

    def _logprobs(self, completion: Completion) -> dict[str, Any] | None:
        if self.top_logprobs is None:
            return None
        return chat_logprobs(self.gateway, completion, self.top_logprobs)

    def body(self) -> dict[str, Any]:
        choices = [
            {
                "index": completion.index,
                "message": chat_message(reply),
                "logprobs": self._logprobs(completion),
                "finish_reason": finish_reason(completion, reply),
            }
            for completion, reply in zip(self.result.completions, self.replies, strict=True)
        ]
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.gateway.model_name,
            "choices": choices,
            "usage": usage(self.result),
        }

    def _chunk(self, choices: list[dict[str, Any]], include_usage: bool) -> str:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.gateway.model_name,
            "choices": choices,
        }
        if include_usage:
            chunk["usage"] = None
        return sse(chunk)

    def stream(self, include_usage: bool) -> Iterator[str]:
        for completion, reply in zip(self.result.completions, self.replies, strict=True):
            index = completion.index
            yield self._chunk([_delta(index, {"role": "assistant", "content": ""})], include_usage)
            if reply.content:
                choice = _delta(index, {"content": reply.content})
                choice["logprobs"] = self._logprobs(completion)
                yield self._chunk([choice], include_usage)
            if reply.tool_calls:
                calls = [call.to_openai(i) for i, call in enumerate(reply.tool_calls)]
                yield self._chunk([_delta(index, {"tool_calls": calls})], include_usage)
            yield self._chunk([_delta(index, {}, finish_reason(completion, reply))], include_usage)
        if include_usage:
            yield sse(
                {
                    "id": self.id,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.gateway.model_name,
                    "choices": [],
                    "usage": usage(self.result),
                }
            )
        yield "data: [DONE]\n\n"


def _delta(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event carrying ``payload`` as JSON."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


class TextAnswer:
    """A finished ``/v1/completions`` answer (legacy completions shape)."""

    def __init__(self, gateway: Gateway, result: CompletionResult, logprobs: int | None) -> None:
        self.gateway = gateway
        self.result = result
        self.logprobs = logprobs
        self.id = new_request_id()
        self.created = int(time.time())

    def _logprobs(self, completion: Completion) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        tokens = [self.gateway.token_text(t) for t in completion.token_ids]
        offsets, position = [], 0
        for token in tokens:
            offsets.append(position)
            position += len(token)
        tops = [dict(_top(completion, i, self.logprobs)) for i in range(len(tokens))] if self.logprobs else None
        return {
            "tokens": tokens,
            "token_logprobs": list(completion.logprobs),
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def _choice(self, completion: Completion) -> dict[str, Any]:
        return {
            "index": completion.index,
            "text": completion.text,
            "logprobs": self._logprobs(completion),
            "finish_reason": "length" if completion.finish_reason == "length" else "stop",
        }

    def body(self) -> dict[str, Any]:
        choices = [self._choice(c) for c in self.result.completions]
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.gateway.model_name,
            "choices": choices,
            "usage": usage(self.result),
        }

    def stream(self, include_usage: bool) -> Iterator[str]:
        for completion in self.result.completions:
            chunk: dict[str, Any] = {
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.gateway.model_name,
                "choices": [self._choice(completion)],
            }
            if include_usage:
                chunk["usage"] = None
            yield sse(chunk)
        if include_usage:
            yield sse(
                {
                    "id": self.id,
                    "object": "text_completion",
                    "created": self.created,
                    "model": self.gateway.model_name,
                    "choices": [],
                    "usage": usage(self.result),
                }
            )
        yield "data: [DONE]\n\n"
