"""The gateway's core: every call, chat or completions, goes through :meth:`Gateway.generate`.

:class:`Gateway` holds the token-level :class:`~telescope.inference.client.InferenceClient`
of one backend server (the embedded engine or vLLM: the same client, the same path), the
model's tokenizer and chat format, and the served model's name and context length (read
from the server's ``/v1/models``).

:meth:`Gateway.generate` takes prompt token ids and sampling options and returns the
backend's :class:`~telescope.inference.client.CompletionResult`: prompt ids, completion
ids, per-token log-probabilities and policy versions. It is the one place where a call
has all of these in hand, so it is where per-call recording hooks in: every observer
given to the gateway receives a :class:`GatewayCall` for each finished call (the
episode recording of a later stage is such an observer; an observer that fails is
logged, never fails the call).

Checks before the backend sees a request:

- the model: ``model`` must be the served name (or the backend's model path), else 404;
- the context: a prompt of ``max_model_len`` tokens or more, or a prompt plus
  ``max_tokens`` over it, is a 400 (``code: context_length_exceeded``) that gives the
  limit; without ``max_tokens`` the completion may use the rest of the context;
- saturation: at most ``max_concurrent_requests`` calls in flight; one more is a 429
  (``Retry-After``) at once instead of a queue without bound. A backend that answers
  503 (after the client's retries) or cannot be reached is a 503.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from telescope.inference.client import CompletionResult, InferenceClient, InferenceServerError
from telescope.inference.gateway.chat import ChatFormat
from telescope.inference.gateway.errors import GatewayError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplingOptions:
    """What the backend is asked for, besides the prompt (``max_tokens`` None: the rest of the context)."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0


@dataclass(frozen=True)
class GatewayCall:
    """One finished call: what an observer (a recorder) receives.

    ``route`` is ``chat`` or ``completions``; ``result`` holds the prompt and completion
    token ids, the log-probabilities and the policy versions of every choice.
    """

    route: str
    prompt_token_ids: list[int]
    options: SamplingOptions
    result: CompletionResult


CallObserver = Callable[[GatewayCall], Awaitable[None] | None]


class CompletionBackend(Protocol):
    """Where a call is generated instead of the gateway's own client (a training episode)."""

    async def complete(self, prompt_ids: list[int], options: SamplingOptions) -> CompletionResult: ...


class Gateway:
    """One backend server behind an OpenAI-compatible front (see the module docstring)."""

    def __init__(
        self,
        client: InferenceClient,
        tokenizer: Any,
        *,
        model_name: str,
        max_model_len: int,
        model_aliases: Sequence[str] = (),
        chat_template: str | None = None,
        tool_parser: str = "auto",
        max_concurrent_requests: int = 64,
        observers: Sequence[CallObserver] = (),
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer, chat_template, tool_parser)
        self.model_name = model_name
        self.model_names = {model_name, *model_aliases}
        self.max_model_len = max_model_len
        self.max_concurrent_requests = max_concurrent_requests
        self.observers = list(observers)
        self.in_flight = 0
        self._token_text: dict[int, str] = {}
        self._episodes: dict[str, Any] = {}

    # ---------------------------------------------------------------- episodes
    def open_episode(self, episode_id: str, backend: Any) -> None:
        """Serve ``backend`` (an :class:`~.episodes.EpisodeBackend`) under ``/episodes/{episode_id}/v1``."""
        self._episodes[episode_id] = backend

    def close_episode(self, episode_id: str) -> None:
        self._episodes.pop(episode_id, None)

    def episode(self, episode_id: str) -> Any:
        """The backend of a running episode; a 404 naming it when it is not running."""
        backend = self._episodes.get(episode_id)
        if backend is None:
            raise GatewayError(
                404,
                f"episode {episode_id!r} is not running (it ended, timed out, or never started); "
                "an episode's client is valid only while its run() is running",
                code="episode_not_found",
            )
        return backend

    @classmethod
    async def connect(cls, client: InferenceClient, tokenizer: Any, **options: Any) -> Gateway:
        """A gateway for the model ``client``'s server serves (its name and context length asked of it)."""
        cards = await client.model_cards()
        if not cards:
            raise RuntimeError(f"the inference server {client.base_url} serves no model")
        card = cards[0]
        aliases = [card["root"]] if card.get("root") else []
        max_len = options.pop("max_model_len", None) or card.get("max_model_len")
        if not max_len:
            raise RuntimeError(f"the inference server {client.base_url} does not say its max_model_len; pass it")
        return cls(
            client, tokenizer, model_name=card["id"], max_model_len=int(max_len), model_aliases=aliases, **options
        )

    # ------------------------------------------------------------------ checks
    def check_model(self, model: str) -> None:
        if model not in self.model_names:
            raise GatewayError(
                404,
                f"the model {model!r} does not exist; this gateway serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def completion_budget(self, prompt_tokens: int, max_tokens: int | None, param: str) -> int:
        """The completion's token limit; a 400 naming the context length when the prompt leaves no room."""
        limit = self.max_model_len
        if prompt_tokens >= limit or (max_tokens is not None and prompt_tokens + max_tokens > limit):
            asked = f" plus {max_tokens} completion tokens" if max_tokens is not None else ""
            raise GatewayError(
                400,
                f"this model's context length is {limit} tokens; the request has {prompt_tokens} prompt tokens"
                f"{asked}; shorten the {param} or lower max_tokens",
                param=param,
                code="context_length_exceeded",
            )
        return max_tokens if max_tokens is not None else limit - prompt_tokens

    def token_text(self, token_id: int) -> str:
        """A token's text decoded alone (cached): how log-probabilities name tokens."""
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = str(self.tokenizer.decode([token_id]))
        return text

    # ---------------------------------------------------------------- the call
    async def generate(
        self, route: str, prompt_ids: list[int], options: SamplingOptions, backend: CompletionBackend | None = None
    ) -> CompletionResult:
        """Complete ``prompt_ids`` on the backend (or ``backend``); every gateway call goes through here."""
        if self.in_flight >= self.max_concurrent_requests:
            raise GatewayError(
                429,
                f"the gateway is saturated ({self.in_flight} requests in flight, its limit); retry shortly",
                code="rate_limit_exceeded",
            )
        self.in_flight += 1
        try:
            if backend is not None:
                result = await backend.complete(prompt_ids, options)
            else:
                result = await self.client.complete(
                    prompt_ids,
                    max_tokens=options.max_tokens,
                    temperature=options.temperature,
                    top_p=options.top_p,
                    n=options.n,
                    stop=list(options.stop),
                    seed=options.seed,
                    num_logprobs=options.top_logprobs,
                )
        except InferenceServerError as exc:
            raise _backend_error(exc) from None
        except httpx.HTTPError as exc:
            raise GatewayError(503, f"the inference server is unreachable ({type(exc).__name__}); retry") from None
        finally:
            self.in_flight -= 1
        await self._observe(GatewayCall(route, list(prompt_ids), options, result))
        return result

    async def _observe(self, call: GatewayCall) -> None:
        for observer in self.observers:
            try:
                outcome = observer(call)
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:
                log.exception("gateway: call observer %r failed; the call is answered anyway", observer)


def _backend_error(exc: InferenceServerError) -> GatewayError:
    """The backend's refusal as the gateway's error (its 4xx passed on; anything else a 503)."""
    text = str(exc).split(": ", 1)[-1]
    if 400 <= exc.status < 500 and exc.status != 429:
        return GatewayError(400 if exc.status == 422 else exc.status, f"the inference server refused: {text}")
    if exc.status == 429:
        return GatewayError(429, "the inference server is saturated; retry shortly", code="rate_limit_exceeded")
    return GatewayError(503, f"the inference server failed ({exc.status}); retry")
