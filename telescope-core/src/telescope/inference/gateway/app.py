"""The gateway's HTTP routes: OpenAI's chat, completions and models API over one :class:`Gateway`.

- ``POST /v1/chat/completions``: messages rendered by :class:`~.chat.ChatFormat`, the
  prompt's token ids sent through :meth:`Gateway.generate`, the reply parsed into
  content and ``tool_calls``;
- ``POST /v1/completions``: a text or token-id prompt through the same call;
- ``GET /v1/models``: the served model and its context length; ``GET /health``.

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

from telescope.inference.gateway.errors import install_error_handlers
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

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        gateway = current()
        card = {
            "id": gateway.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "telescope",
            "max_model_len": gateway.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest) -> Response:
        gateway = current()
        gateway.check_model(body.model)
        prompt_ids, prefix = gateway.chat.prompt_ids(body)
        budget = gateway.completion_budget(len(prompt_ids), body.token_limit, "messages")
        top = (body.top_logprobs or 0) if body.logprobs else 0
        result = await gateway.generate("chat", prompt_ids, _options(body, budget, top))
        replies = [gateway.chat.reply(body, prefix, completion.text) for completion in result.completions]
        answer = ChatAnswer(gateway, result, replies, top if body.logprobs else None)
        if body.stream:
            return StreamingResponse(answer.stream(body.include_usage), media_type="text/event-stream")
        return JSONResponse(answer.body())

    @app.post("/v1/completions", response_model=None)
    async def completions(body: TextCompletionRequest) -> Response:
        gateway = current()
        gateway.check_model(body.model)
        prompt = body.single_prompt
        prompt_ids = gateway.chat.encode(prompt) if isinstance(prompt, str) else prompt
        budget = gateway.completion_budget(len(prompt_ids), body.max_tokens or 16, "prompt")
        result = await gateway.generate("completions", prompt_ids, _options(body, budget, body.logprobs or 0))
        answer = TextAnswer(gateway, result, body.logprobs)
        if body.stream:
            return StreamingResponse(answer.stream(body.include_usage), media_type="text/event-stream")
        return JSONResponse(answer.body())

    return app
