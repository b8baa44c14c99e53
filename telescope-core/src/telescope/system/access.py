"""The run's access token: who may call the run's servers.

Every HTTP server a run starts (the inference servers: generation, weight updates,
metrics; the OTLP trace receiver; a future agent gateway in front of the inference
backends) asks for one secret, the *run token*, in ``Authorization: Bearer <token>``.
The run makes it at launch (:func:`new_run_token`, 256 random bits), keeps it in the
orchestrator's memory for its clients, and hands it to each server process in its
environment (:data:`RUN_TOKEN_ENV`), never on a command line, which ``ps`` shows to
every user of the machine. It is never written to the run directory or to a log.

:class:`RunTokenMiddleware` is the one check, an ASGI middleware that any FastAPI or
Starlette app of the run mounts (``app.add_middleware(RunTokenMiddleware, token=...)``;
without ``token`` it reads :data:`RUN_TOKEN_ENV`, which is how vLLM's ``--middleware``
builds it). A request without the token, or with another one, gets ``401`` with an
OpenAI-shaped error body (``{"error": {"message", "type", "param", "code"}}``) and a
``WWW-Authenticate: Bearer`` header, and never reaches the app. The tokens are
compared in constant time.

``GET /health`` stays open (:data:`OPEN_PATHS`): it answers an empty 200 or 503, so
it tells a caller only whether the server is up, and liveness probes (a scheduler's,
the run's own start-up wait) need no secret. Everything else, ``/v1/models`` and
``/metrics`` included (they name the model and its load), asks for the token.

It is a pure ASGI middleware, not Starlette's ``BaseHTTPMiddleware``: the request's
``receive`` reaches the app untouched, so a route that listens for the client's
disconnect (the inference servers abort a request whose client went away) still
hears it, and streamed answers stream.

Limits: the token guards access, not the wire; the servers speak plain HTTP, so
anyone who can read the cluster network's traffic can read it. It is a bearer token:
whoever holds it is the run.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

#: The environment variable that carries the run token to a server process.
RUN_TOKEN_ENV = "TELESCOPE_RUN_TOKEN"
#: Paths answered without the token (an empty up/down answer only).
OPEN_PATHS = frozenset({"/health"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def new_run_token() -> str:
    """A fresh run token (URL-safe text of 32 random bytes)."""
    return secrets.token_urlsafe(32)


def authorization_header(token: str | None) -> dict[str, str]:
    """The header a client sends with every request (none without a token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def token_from_env(environ: MutableMapping[str, str] | None = None) -> str | None:
    """The run token this process was given (:data:`RUN_TOKEN_ENV`), or None."""
    return (os.environ if environ is None else environ).get(RUN_TOKEN_ENV) or None


def with_run_token(environ: dict[str, str], token: str | None) -> dict[str, str]:
    """``environ`` for a server process: :data:`RUN_TOKEN_ENV` is ``token`` (removed when None)."""
    if token:
        environ[RUN_TOKEN_ENV] = token
    else:
        environ.pop(RUN_TOKEN_ENV, None)
    return environ


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The token of an ``Authorization: Bearer ...`` header among raw ASGI ``headers``, or None."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, credentials = value.decode("latin-1").partition(" ")
            return credentials.strip() if scheme.lower() == "bearer" else None
    return None


def _unauthorized_body(message: str) -> bytes:
    error = {"message": message, "type": "AuthenticationError", "param": None, "code": 401}
    return json.dumps({"error": error}).encode()


class RunTokenMiddleware:
    """Answers 401 to every HTTP request without the run token (see the module docstring).

    ``token`` None: the one in :data:`RUN_TOKEN_ENV`; a middleware with no token at
    all refuses to start (a server meant to be guarded must not run open by mistake).
    """

    def __init__(self, app: ASGIApp, token: str | None = None) -> None:
        token = token or token_from_env()
        if not token:
            raise RuntimeError(f"RunTokenMiddleware has no token: pass token= or set {RUN_TOKEN_ENV}")
        self.app = app
        self._expected = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = bearer_token(scope.get("headers", []))
        if given is not None and hmac.compare_digest(given.encode(), self._expected):
            await self.app(scope, receive, send)
            return
        reason = "no run token" if given is None else "a wrong run token"
        body = _unauthorized_body(
            f"{scope.get('path', '')}: {reason}; send the run's token as 'Authorization: Bearer <token>'"
        )
        if scope["type"] == "websocket":  # refused before the handshake completes
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
