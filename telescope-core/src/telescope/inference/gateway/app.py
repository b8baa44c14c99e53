"""The gateway's HTTP routes: OpenAI's chat, completions and models API over one :class:`Gateway`.

- ``POST /v1/chat/completions``: messages rendered by :class:`~.chat.ChatFormat`, the
  prompt's token ids sent through :meth:`Gateway.generate`, the reply parsed into
  content and ``tool_calls``;
- ``POST /v1/completions``: a text or token-id prompt through the same call;
- ``GET /v1/models``: the served model and its context length; ``GET /health``;
- the same three under ``/episodes/{episode_id}/v1``: one training episode's calls,
  generated and recorded by its :class:`~.episodes.EpisodeBackend` (:mod:`.episodes`).

``stream: true`` answers as server-sent events (see :mod:`.responses` for what a stream
holds and its limit). Errors: :mod:`.errors`. Authentication: :func:`create_gateway_app`'s
``api_key``, checked as the run's servers check the run token.

Limit: a caller that disconnects does not abort its call; the backend finishes it (bounded
by its ``max_tokens``) and the answer is dropped.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response, StreamingResponse

from telescope.inference.gateway.episodes import EpisodeBackend
from telescope.inference.gateway.errors import GatewayError, install_error_handlers
from telescope.inference.gateway.responses import ChatAnswer, TextAnswer
from telescope.inference.gateway.schema import ChatCompletionRequest, TextCompletionRequest
from telescope.inference.gateway.service import Gateway, SamplingOptions
from telescope.system.access import RunTokenMiddleware


def _options(body: ChatCompletionRequest | TextCompletionRequest, max_tokens: int, top: int) -> SamplingOptions:
    return SamplingOptions(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=body.top_p,
        n=body.n,
        stop=tuple(body.stop_strings),
        seed=body.seed,
        top_logprobs=top,
    )


def _one_choice(body: ChatCompletionRequest | TextCompletionRequest) -> None:
    if body.n != 1:
        raise GatewayError(400, f"n is {body.n}; a training episode takes one choice per call (n: 1)", param="n")


def create_gateway_app(gateway: Gateway | Callable[[], Awaitable[Gateway]], *, api_key: str | None = None) -> FastAPI:
    """The ASGI app serving ``gateway``, or the one ``gateway()`` makes at start-up (in the server's loop).

    With ``api_key``, every route but ``/health`` asks for ``Authorization: Bearer <api_key>``
    (the run token's check, :class:`~telescope.system.access.RunTokenMiddleware`: 401 in
    OpenAI's error shape otherwise).

    Pass a factory when the gateway's client must be made in the event loop that serves the
    app (a server started in another thread or process); the app's lifespan closes its client.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        made = await gateway() if not isinstance(gateway, Gateway) else None
        if made is not None:
            app.state.gateway = made
        try:
            yield
        finally:
            if made is not None:
                await made.client.aclose()

    app = FastAPI(title="Telescope OpenAI-compatible gateway", lifespan=lifespan)
    if isinstance(gateway, Gateway):
        app.state.gateway = gateway
    install_error_handlers(app)
    if api_key is not None:
        app.add_middleware(RunTokenMiddleware, token=api_key)

    def current() -> Gateway:
        served: Gateway = app.state.gateway
        return served

    @app.get("/health")
    async def health() -> Response:
        gateway = current()
        return Response(status_code=200 if await gateway.client.health() else 503)

    def model_card(gateway: Gateway) -> JSONResponse:
        card = {
            "id": gateway.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "telescope",
            "max_model_len": gateway.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def chat(body: ChatCompletionRequest, episode: EpisodeBackend | None) -> Response:
        gateway = current()
        if episode is None:
            gateway.check_model(body.model)
        else:
            _one_choice(body)
        prompt_ids, prefix = gateway.chat.prompt_ids(body)
        if episode is not None:
            prompt_ids = episode.chat_prompt_ids(body, prompt_ids, prefix)
        budget = gateway.completion_budget(len(prompt_ids), body.token_limit, "messages")
        top = (body.top_logprobs or 0) if body.logprobs else 0
        result = await gateway.generate("chat", prompt_ids, _options(body, budget, top), episode)
        replies = [gateway.chat.reply(body, prefix, completion.text) for completion in result.completions]
        if episode is not None:
            episode.record(body, prefix, result, replies)
        answer = ChatAnswer(gateway, result, replies, top if body.logprobs else None)
        if body.stream:
            return StreamingResponse(answer.stream(body.include_usage), media_type="text/event-stream")
        return JSONResponse(answer.body())

    async def complete(body: TextCompletionRequest, episode: EpisodeBackend | None) -> Response:
        gateway = current()
        if episode is None:
            gateway.check_model(body.model)
        else:
            _one_choice(body)
        prompt = body.single_prompt
        prompt_ids = gateway.chat.encode(prompt) if isinstance(prompt, str) else prompt
        budget = gateway.completion_budget(len(prompt_ids), body.max_tokens or 16, "prompt")
        result = await gateway.generate("completions", prompt_ids, _options(body, budget, body.logprobs or 0), episode)
        if episode is not None:
            episode.record(body, "", result, [])
        answer = TextAnswer(gateway, result, body.logprobs)
        if body.stream:
            return StreamingResponse(answer.stream(body.include_usage), media_type="text/event-stream")
        return JSONResponse(answer.body())

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return model_card(current())

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest) -> Response:
        return await chat(body, None)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: TextCompletionRequest) -> Response:
        return await complete(body, None)

    @app.get("/episodes/{episode_id}/v1/models")
    async def episode_models(episode_id: str) -> JSONResponse:
        current().episode(episode_id)
        return model_card(current())

    @app.post("/episodes/{episode_id}/v1/chat/completions", response_model=None)
    async def episode_chat_completions(episode_id: str, body: ChatCompletionRequest) -> Response:
        return await chat(body, current().episode(episode_id))

    @app.post("/episodes/{episode_id}/v1/completions", response_model=None)
    async def episode_completions(episode_id: str, body: TextCompletionRequest) -> Response:
        return await complete(body, current().episode(episode_id))

    return app
