"""The request bodies the gateway accepts, as OpenAI defines them (the fields it honours).

Chat (``POST /v1/chat/completions``): ``model``, ``messages`` (roles ``system``,
``developer``, ``user``, ``assistant``, ``tool``; content as text or a list of text
parts), ``tools`` (``type: function``), ``tool_choice`` (``auto``, ``none``,
``required`` or one named function), ``n``, ``temperature``, ``top_p``, ``max_tokens`` /
``max_completion_tokens``, ``stop``, ``seed``, ``logprobs`` and ``top_logprobs``,
``stream`` with ``stream_options.include_usage``.

Completions (``POST /v1/completions``): ``model``, ``prompt`` (text or token ids, one
prompt), ``n``, ``temperature``, ``top_p``, ``max_tokens``, ``stop``, ``seed``,
``logprobs`` (a number of alternatives), ``echo`` (false only), ``stream`` with
``stream_options``.

Other OpenAI fields are accepted and ignored while they keep their neutral value; one
that would change the answer and that the gateway cannot honour (``logit_bias``,
penalties, ``response_format`` other than text, images or audio in content) is refused
with a 400 naming it, never silently dropped.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Role = Literal["system", "developer", "user", "assistant", "tool"]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: str = "{}"


class MessageToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Role
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _text_parts_only(cls, value: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        if isinstance(value, list):
            for part in value:
                if part.get("type") not in ("text", "input_text", "output_text", "refusal"):
                    raise ValueError(f"content parts of type {part.get('type')!r} are not supported; send text parts")
        return value

    def text(self) -> str:
        """The content as one string (text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(part.get("text", part.get("refusal", ""))) for part in self.content)


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDefinition(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"] = "function"
    function: dict[str, str]

    @field_validator("function")
    @classmethod
    def _has_name(cls, value: dict[str, str]) -> dict[str, str]:
        if not value.get("name"):
            raise ValueError("a named tool_choice needs function.name")
        return value


class _Sampling(BaseModel):
    """The sampling fields chat and completions share."""

    model_config = ConfigDict(extra="allow")

    model: str
    n: int = Field(1, ge=1, le=64)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    @model_validator(mode="after")
    def _refuse_unhonoured(self) -> _Sampling:
        if self.logit_bias:
            raise ValueError("logit_bias: not supported by the gateway; leave it out")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ValueError(f"{name}: not supported by the gateway; leave it out or set 0")
        return self

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 16:
            raise ValueError(f"at most 16 stop sequences, got {len(value)}")
        return value

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs: true")
        if self.response_format is not None and self.response_format.get("type", "text") != "text":
            raise ValueError("response_format: only {'type': 'text'} is supported (no constrained decoding)")
        if isinstance(self.tool_choice, NamedToolChoice) or self.tool_choice == "required":
            names = {tool.function.name for tool in self.tools or ()}
            if not names:
                raise ValueError("tool_choice: asks for a tool call but tools is empty")
            if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function["name"] not in names:
                raise ValueError(f"tool_choice: names {self.tool_choice.function['name']!r}, not one of tools")
        return self

    @property
    def token_limit(self) -> int | None:
        """``max_completion_tokens`` (OpenAI's current name), else ``max_tokens``."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def forced_tool(self) -> str | None:
        """The function ``tool_choice`` names, ``""`` for ``required``, None when the model chooses."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function["name"]
        return "" if self.tool_choice == "required" else None


class TextCompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> TextCompletionRequest:
        if self.echo:
            raise ValueError("echo: not supported by the gateway; leave it out")
        if self.suffix:
            raise ValueError("suffix: not supported by the gateway; leave it out")
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ValueError(f"prompt: holds {len(prompt)} prompts; send one prompt per request")
            self.prompt = prompt[0]
        return self

    @property
    def single_prompt(self) -> str | list[int]:
        """The one prompt: its text, or its token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return prompt
        return [token for token in prompt if isinstance(token, int)]  # all of them: _one_prompt unwrapped a batch
