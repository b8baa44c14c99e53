"""Tool-call parsers: a completion's text -> its content and its OpenAI ``tool_calls``.

A parser is a plain function ``(text) -> ParsedReply``, registered by name in
:data:`PARSERS` and chosen per model: ``--tool-parser NAME``, or by
:func:`parser_for_template` from the chat template (one that writes ``<tool_call>``
gets ``hermes``). Adding a format is adding one function to the mapping.

``hermes``: the markup of Hermes and Qwen2.5 templates (and the tiny models'),
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number per reply. A
block whose JSON does not parse or lacks a ``name`` is left in the content as text, so
nothing the model wrote is lost; the content is what remains outside the blocks.

Limits: a parser reads finished text (the gateway streams a finished completion, see
:mod:`.streaming`); nothing constrains the model to the schema of ``tools``, so
``arguments`` is whatever JSON the model wrote.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from telescope.inference.protocol import new_request_id


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: the OpenAI ``tool_calls`` entry's fields."""

    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: "call_" + new_request_id().removeprefix("cmpl-"))

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        function = {"name": self.name, "arguments": self.arguments}
        out: dict[str, Any] = {"id": self.id, "type": "function", "function": function}
        if index is not None:
            out["index"] = index
        return out


@dataclass(frozen=True)
class ParsedReply:
    content: str
    tool_calls: tuple[ToolCall, ...] = ()


ToolParser = Callable[[str], ParsedReply]

_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _hermes_call(block: str) -> ToolCall | None:
    try:
        payload = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None
    arguments = payload.get("arguments", {})
    return ToolCall(payload["name"], arguments if isinstance(arguments, str) else json.dumps(arguments))


def parse_hermes(text: str) -> ParsedReply:
    """``<tool_call>{json}</tool_call>`` blocks -> calls; the rest (and any unreadable block) -> content."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    position = 0
    for match in _HERMES_BLOCK.finditer(text):
        call = _hermes_call(match.group(1))
        if call is None:
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        calls.append(call)
    kept.append(text[position:])
    content = "".join(kept)
    return ParsedReply(content.strip() if calls else content, tuple(calls))


def parse_none(text: str) -> ParsedReply:
    """No tool calls: the text is the content (models whose template has no tool markup)."""
    return ParsedReply(text)


PARSERS: dict[str, ToolParser] = {"hermes": parse_hermes, "none": parse_none}


def parser_for_template(chat_template: str | None) -> str:
    """The parser a chat template implies: ``hermes`` when it writes ``<tool_call>``, else ``none``."""
    return "hermes" if chat_template and "<tool_call>" in chat_template else "none"


def get_parser(name: str) -> ToolParser:
    if name not in PARSERS:
        raise ValueError(f"unknown tool parser {name!r}; available: {', '.join(PARSERS)}")
    return PARSERS[name]
