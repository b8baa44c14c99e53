"""Chat requests -> prompt token ids with the model's own chat template, and replies -> messages.

:class:`ChatFormat` renders the OpenAI ``messages`` (and ``tools``) with the tokenizer's
chat template (or an override), as the model was trained to read them, and tokenizes the
text; the backend receives token ids only. OpenAI's wire shapes become the template's:
``developer`` is rendered as ``system``, text parts are joined, and a tool call's
``arguments`` (JSON text on the wire) is handed to the template as an object, as
Hugging Face templates expect. A conversation that ends with an assistant message is
continued (the reply extends that message) instead of starting a new turn.

``tool_choice``: ``auto`` (or unset, with tools) renders the tools and parses calls
back; ``none`` renders no tools and parses nothing; ``required`` and a named function
put the start of a call in the model's mouth (for the ``hermes`` format
``<tool_call>{"name": "`` resp. ``<tool_call>{"name": "NAME", "arguments": ``), so the
reply is a call; the prefix is part of the prompt, and is put back before parsing.
Other parsers support only ``auto`` and ``none``.
"""

from __future__ import annotations

import json
from typing import Any

from telescope.inference.gateway.errors import GatewayError
from telescope.inference.gateway.schema import ChatCompletionRequest, ChatMessage
from telescope.inference.gateway.tool_parsers import ParsedReply, get_parser, parse_none, parser_for_template


def _arguments(text: str) -> Any:
    """A call's arguments as the template expects them: the JSON object, else the text as sent."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def template_tool_call(call_id: str | None, name: str, arguments: str) -> dict[str, Any]:
    """One tool call (its ``arguments`` JSON text on the wire) in the shape Hugging Face chat templates read."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": _arguments(arguments)}}


def template_message(message: ChatMessage) -> dict[str, Any]:
    """One OpenAI message in the shape Hugging Face chat templates read."""
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role}
    out["content"] = message.text()
    if message.tool_calls:
        out["tool_calls"] = [
            template_tool_call(call.id, call.function.name, call.function.arguments) for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def forced_call_prefix(parser: str, tool: str) -> str:
    """What the reply starts with when ``tool_choice`` forces a call (``tool`` ``""``: any tool)."""
    if parser != "hermes":
        message = f"tool_choice that forces a call needs the hermes tool format; this model's parser is {parser!r}"
        raise GatewayError(400, message, param="tool_choice")
    return '<tool_call>{"name": "' + (f'{tool}", "arguments": ' if tool else "")


class ChatFormat:
    """A tokenizer's chat template and tool-call format (see the module docstring)."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None, tool_parser: str = "auto") -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        template = chat_template or getattr(tokenizer, "chat_template", None)
        if not template:
            raise ValueError(
                "the model's tokenizer has no chat template; pass one (--chat-template FILE) to serve chat"
            )
        self.parser_name = parser_for_template(template) if tool_parser == "auto" else tool_parser
        self.parser = get_parser(self.parser_name)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render_messages(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *, generation_prompt: bool = True
    ) -> str:
        """Template messages (:func:`template_message`) as the prompt's text.

        ``generation_prompt``: end with the assistant's turn opened (or, when the last message
        is the assistant's, inside it); False: end after the last message, closed.
        """
        kwargs: dict[str, Any] = {"tokenize": False}
        if tools:
            kwargs["tools"] = tools
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        if generation_prompt and messages[-1]["role"] == "assistant":
            kwargs["continue_final_message"] = True
        elif generation_prompt:
            kwargs["add_generation_prompt"] = True
        try:
            return str(self.tokenizer.apply_chat_template(messages, **kwargs))
        except Exception as exc:  # the template's own checks (raise_exception) and Jinja errors
            raise GatewayError(
                400, f"the model's chat template cannot render these messages: {exc}", param="messages"
            ) from None

    @staticmethod
    def rendered_tools(request: ChatCompletionRequest) -> list[dict[str, Any]] | None:
        """The tools as the template is given them (None when none are rendered: ``tool_choice: none``)."""
        if not request.tools or request.tool_choice == "none":
            return None
        return [tool.model_dump(exclude_none=True) for tool in request.tools]

    def render(self, request: ChatCompletionRequest) -> tuple[str, str]:
        """The prompt's text and the reply's forced prefix (``""`` when the model starts freely)."""
        messages = [template_message(m) for m in request.messages]
        tools = self.rendered_tools(request)
        text = self.render_messages(messages, tools)
        use_tools = tools is not None
        forced = request.forced_tool if use_tools else None
        prefix = forced_call_prefix(self.parser_name, forced) if forced is not None else ""
        return text + prefix, prefix

    def prompt_ids(self, request: ChatCompletionRequest) -> tuple[list[int], str]:
        """The prompt's token ids and the reply's forced prefix."""
        text, prefix = self.render(request)
        return self.encode(text), prefix

    def continuation_ids(
        self,
        history: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        reply: dict[str, Any],
        generated_ids: list[int],
        new_messages: list[dict[str, Any]],
    ) -> list[int] | None:
        """The tokens that follow a reply's own ``generated_ids`` when a conversation goes on.

        ``history`` was rendered (with ``tools``) and answered with ``generated_ids``; the
        caller now sends ``history + [reply] + new_messages``. The answer is what the
        template closes the reply with and the model did not generate (found by rendering a
        placeholder reply, less what the model's own tokens already end with, such as its
        end-of-turn token), then the new messages' text and the next generation prompt,
        tokenized. None when the template does not render the longer conversation as an
        extension of the shorter one (a template that rewrites earlier turns): the tokens
        cannot be reused.
        """
        placeholder = "\x00reply\x00"
        closed = self.render_messages(
            [*history, {"role": "assistant", "content": placeholder}], tools, generation_prompt=False
        )
        with_reply = self.render_messages([*history, reply], tools, generation_prompt=False)
        with_next = self.render_messages([*history, reply, *new_messages], tools)
        if placeholder not in closed or not with_next.startswith(with_reply):
            return None
        closing = closed[closed.index(placeholder) + len(placeholder) :]
        generated = str(self.tokenizer.decode(generated_ids, skip_special_tokens=False))
        already = max((n for n in range(len(closing), 0, -1) if generated.endswith(closing[:n])), default=0)
        return self.encode(closing[already:] + with_next[len(with_reply) :])

    def reply(self, request: ChatCompletionRequest, prefix: str, text: str) -> ParsedReply:
        """The assistant message of a completion: content and the tool calls the model wrote."""
        if not request.tools or request.tool_choice == "none":
            return parse_none(text)
        return self.parser(prefix + text)
