"""The wire format shared by the embedded server, the client and the vLLM backend.

These pydantic models mirror the subset of vLLM's OpenAI-compatible
``/v1/completions`` API that Telescope uses (field names and meanings as in
``vllm/entrypoints/openai/completion/protocol.py``):

- request: ``prompt`` as text or as token ids, ``n``, ``max_tokens``,
  ``temperature``, ``top_p``, ``stop``, ``stop_token_ids``, ``seed``,
  ``logprobs`` (number of alternatives; ``0`` = only the sampled token),
  ``priority`` (lower = earlier, as in vLLM), ``request_id``,
  ``return_token_ids``, ``ignore_eos``, ``skip_special_tokens``;
- response choice: ``text``, ``logprobs`` (``tokens``, ``token_logprobs``,
  ``top_logprobs``, ``text_offset``), ``finish_reason`` (``stop`` | ``length``
  | ``abort``), ``stop_reason``, ``token_ids`` and ``prompt_token_ids`` (vLLM
  returns both when ``return_token_ids`` is true).

Telescope extensions (optional fields; vLLM leaves them out, the client fills what it
can): ``policy_version_start`` / ``policy_version_end`` (the weights version that
computed the first / last generated token) and ``token_policy_versions`` (one per
generated token; the embedded engine only); on the response, ``timing`` (when the
request was queued, admitted, got its first token and finished, in UNIX seconds on the
server's clock; the embedded engine only, see :class:`RequestTiming`).

Unknown request fields are ignored (vLLM accepts many more; a client written for
vLLM keeps working against the embedded server). A batch of prompts in one request
is rejected with a clear error: Telescope sends one prompt per request.

Log-probabilities: ``token_logprobs[t]`` is the sampled token's log-probability in
the distribution it was sampled from, ``log_softmax(logits / temperature)``
restricted to the top-p nucleus and renormalised when ``top_p`` is set (vLLM's
``processed_logprobs``; see :mod:`telescope.inference.embedded.sampling`).
"""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: JSON cannot carry -inf; like vLLM, impossible tokens report this value.
NEG_INF_LOGPROB = -9999.0

FinishReason = Literal["stop", "length", "abort"]


#: A random prefix per process, then a counter: unique like a uuid4 per request, without
#: reading the OS's random source for every completion.
_ID_PREFIX = uuid.uuid4().hex[:16]
_id_counter = itertools.count()


def new_request_id() -> str:
    return f"cmpl-{_ID_PREFIX}{next(_id_counter):08x}"


class CompletionRequest(BaseModel):
    """``POST /v1/completions`` body (the fields Telescope sends or accepts)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: str | list[int]
    max_tokens: int = Field(16, ge=0)
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    logprobs: int | None = Field(None, ge=0, le=20)
    priority: int = 0
    request_id: str | None = None
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stream: bool = False

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: object) -> object:
        if isinstance(value, list) and value and isinstance(value[0], (list, str)):
            if len(value) != 1:
                raise ValueError(
                    f"prompt holds a batch of {len(value)} prompts; send one prompt per request "
                    "(text or a list of token ids)"
                )
            return value[0]
        return value

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, value: bool) -> bool:
        if value:
            raise ValueError("stream=true is not supported by the embedded engine; Telescope reads whole completions")
        return value

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionLogProbs(BaseModel):
    """OpenAI/vLLM legacy completions log-probability block."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    # Telescope extensions (absent from vLLM responses).
    policy_version_start: int | None = None
    policy_version_end: int | None = None
    token_policy_versions: list[int] | None = None


class UsageInfo(BaseModel):
    model_config = ConfigDict(extra="ignore")

    prompt_tokens: int = 0
    completion_tokens: int | None = 0
    total_tokens: int = 0


class RequestTiming(BaseModel):
    """Telescope extension: a request's life on the server (UNIX seconds; ``None`` where it never got there)."""

    model_config = ConfigDict(extra="ignore")

    queued: float
    started: float | None = None
    first_token: float | None = None
    finished: float | None = None


class CompletionResponse(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str = Field(default_factory=new_request_id)
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo = Field(default_factory=UsageInfo)
    timing: RequestTiming | None = None  # Telescope extension (absent from vLLM responses)


class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "telescope"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: str = "list"
    data: list[ModelCard]


class CollectiveRpcRequest(BaseModel):  # type: ignore[no-redef]  # its field "kwargs" (vLLM's name) meets the plugin's **kwargs
    """``POST /collective_rpc`` body, as vLLM's dev-mode route takes it.

    vLLM passes only strings to the worker method (the method decodes them);
    Telescope's weight-update methods take one JSON string.
    """

    method: str
    args: list[str] = Field(default_factory=list)
    kwargs: dict[str, str] = Field(default_factory=dict)
    timeout: float | None = None


class CompletionBatchRequest(BaseModel):
    """``POST /v1/completions/batch`` (embedded engine extension): several completion requests in one POST.

    The answer is newline-delimited JSON, one :class:`CompletionBatchLine` per request in
    the order they finish, so each request keeps its own id, seed, timing and error.
    Each request is validated as a :class:`CompletionRequest` on its own, so an invalid
    one gets its own error line (422) instead of failing the whole batch.
    """

    requests: list[dict[str, Any]]


class CompletionBatchLine(BaseModel):
    """One finished request of a batch: its position, its HTTP status, and its response or error message."""

    index: int = Field(ge=0)
    status: int = 200
    response: CompletionResponse | None = None
    error: str | None = None


class AbortRequest(BaseModel):
    """``POST /abort_requests`` (embedded engine extension): abort by request id."""

    request_ids: list[str]
