"""Tool calling: Python functions as tools, parsed from model output and executed.

:class:`ToolEnvironment` extends :class:`MultiTurnEnvironment`:

- ``tools`` is a list of plain Python functions. Each is turned into an
  OpenAI-style function schema from its signature (type annotations) and its
  docstring (first paragraph, and an ``Args:`` section for parameter descriptions).
- The model calls a tool by writing ``<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>`` (XML tags around JSON, the Hermes/Qwen convention). Override
  :meth:`ToolEnvironment.parse_tool_calls` for another format.
- Each call is executed; a malformed call, an unknown tool, bad arguments or an
  exception inside the tool become an error message returned to the model, never
  a crash. The interaction ends when the model's reply has no tool call or after
  ``max_turns``.
- :meth:`ToolEnvironment.get_tool_metrics` summarises the rollout's calls with the
  keys the documentation lists, ready to merge into ``sample_metrics``.

Limits: tools run in the orchestrator's worker thread, in-process, with no time
limit; a tool that runs untrusted code must do so through a sandbox
(``telescope_sandbox``), not directly.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from telescope.api.environment import MultiTurnEnvironment, RolloutState
from telescope.api.events import timed
from telescope.api.records import Message

#: The tool name a call without one is counted and recorded under.
MALFORMED = "<malformed>"

_JSON_TYPES: dict[Any, str] = {
    int: "integer",
    float: "number",
    str: "string",
    bool: "boolean",
    list: "array",
    tuple: "array",
    dict: "object",
}

_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass
class ToolCall:
    """A parsed tool call; ``error`` is set when the call could not be parsed."""

    name: str
    arguments: dict[str, Any]
    error: str | None = None


def _json_type(annotation: Any) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _json_type(args[0]) if len(args) == 1 else {}
    if origin is typing.Literal:
        values = list(typing.get_args(annotation))
        return {"type": _JSON_TYPES.get(type(values[0]), "string"), "enum": values}
    base = origin or annotation
    if base in _JSON_TYPES:
        schema: dict[str, Any] = {"type": _JSON_TYPES[base]}
        if base in (list, tuple) and typing.get_args(annotation):
            schema["items"] = _json_type(typing.get_args(annotation)[0])
        return schema
    return {}


def _docstring_parts(func: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    doc = inspect.getdoc(func) or ""
    description = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    params: dict[str, str] = {}
    match = re.search(r"^(?:Args|Arguments|Parameters):\s*$(.*?)(?:^\S|\Z)", doc, re.M | re.S)
    if match:
        for line in match.group(1).splitlines():
            m = re.match(r"\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)", line)
            if m:
                params[m.group(1)] = m.group(2).strip()
    return description, params


def function_to_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI-style ``{"type": "function", "function": {...}}`` schema of a function."""
    signature = inspect.signature(func)
    hints = typing.get_type_hints(func)
    description, param_docs = _docstring_parts(func)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in signature.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        prop = _json_type(hints.get(name, Any))
        if name in param_docs:
            prop["description"] = param_docs[name]
        properties[name] = prop
        if param.default is inspect.Parameter.empty:
            required.append(name)
    return {
        "type": "function",
        "function": {
            "name": func.__name__,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def parse_xml_tool_calls(text: str) -> list[ToolCall]:
    """Parse ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks."""
    calls: list[ToolCall] = []
    for body in _TOOL_CALL_RE.findall(text):
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            calls.append(ToolCall("", {}, f"the tool call is not valid JSON: {exc.msg}"))
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            calls.append(ToolCall("", {}, 'a tool call needs {"name": ..., "arguments": {...}}'))
            continue
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if not isinstance(arguments, dict):
            calls.append(ToolCall(payload["name"], {}, "tool call arguments must be a JSON object"))
            continue
        calls.append(ToolCall(payload["name"], arguments))
    return calls


class ToolEnvironment(MultiTurnEnvironment):
    """A multi-turn environment whose environment turns are tool results."""

    #: The tools, as plain functions (a subclass sets this, or passes ``tools=``).
    tools: ClassVar[list[Callable[..., Any]]] = []
    #: Role of the messages that carry tool results.
    tool_message_role: ClassVar[str] = "tool"

    def __init__(self, tools: list[Callable[..., Any]] | None = None) -> None:
        self._tools: dict[str, Callable[..., Any]] = {
            f.__name__: f for f in (tools if tools is not None else type(self).tools)
        }

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        return [function_to_schema(f) for f in self._tools.values()]

    def parse_tool_calls(self, text: str) -> list[ToolCall]:
        return parse_xml_tool_calls(text)

    def refusal(self, call: ToolCall) -> str | None:
        """Why ``call`` cannot run (malformed, an unknown tool, arguments that do not bind), or None."""
        if call.error:
            return call.error
        func = self._tools.get(call.name)
        if func is None:
            return f"unknown tool {call.name!r}; available: {', '.join(self._tools)}"
        try:
            inspect.signature(func).bind(**call.arguments)
        except TypeError as exc:
            return f"bad arguments for {call.name}: {exc}"
        return None

    def call_tool(self, call: ToolCall) -> tuple[bool, str]:
        """Execute one call; returns (succeeded, text for the model).

        Every call is one timed ``tool.call`` event, a refused one (:meth:`refusal`) too, with
        ``ok`` false and its ``error``: the events show each call the rollout's metrics count.
        """
        with timed("tool.call", tool=call.name or MALFORMED) as event:
            refused = self.refusal(call)
            if refused is not None:
                event.update(ok=False, error=refused)
                return False, f"Error: {refused}"
            try:
                result = self._tools[call.name](**call.arguments)
            except Exception as exc:  # the model sees the error and may recover
                event.update(ok=False, error=f"{type(exc).__name__}: {exc}")
                return False, f"Error: {call.name} raised {type(exc).__name__}: {exc}"
            event["ok"] = True
        return True, result if isinstance(result, str) else json.dumps(result)

    def _last_calls(self, messages: list[Message]) -> list[ToolCall]:
        last = messages[-1] if messages else {}
        if last.get("role") != "assistant":
            return []
        return self.parse_tool_calls(str(last.get("content", "")))

    def is_done(self, messages: list[Message], state: RolloutState) -> bool:
        return state.turn >= self.max_turns or not self._last_calls(messages)

    def env_response(self, messages: list[Message], state: RolloutState) -> list[Message]:
        replies: list[Message] = []
        log: list[tuple[str, bool]] = state.data.setdefault("tool_calls", [])
        for call in self._last_calls(messages):
            ok, text = self.call_tool(call)
            log.append((call.name or MALFORMED, ok))
            replies.append({"role": self.tool_message_role, "content": text})
        return replies

    def get_tool_metrics(self, state: RolloutState) -> dict[str, float]:
        """Counts of this rollout's tool calls: totals, successes, errors, per tool."""
        log: list[tuple[str, bool]] = state.data.get("tool_calls", [])
        total = len(log)
        success = sum(1 for _, ok in log if ok)
        metrics: dict[str, float] = {
            "total_tool_calls": total,
            "tool_success_count": success,
            "tool_error_count": total - success,
            "tool_success_rate": success / total if total else 0.0,
            "unique_tools_used": len({name for name, _ in log if name in self._tools}),
        }
        for name in self._tools:
            metrics[f"{name}_calls"] = sum(1 for n, _ in log if n == name)
        return metrics
