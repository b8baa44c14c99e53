"""The run token's check (``RunTokenMiddleware``) on a bare ASGI app, and how a server process gets the token."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from telescope.system.access import (
    RUN_TOKEN_ENV,
    RunTokenMiddleware,
    authorization_header,
    new_run_token,
    token_from_env,
    with_run_token,
)

TOKEN = "s3cret-run-token"


def app(token: str | None = TOKEN) -> Starlette:
    async def answer(request: Request) -> PlainTextResponse:
        return PlainTextResponse(f"reached {request.url.path}")

    routes = [Route(path, answer, methods=["GET", "POST"]) for path in ("/health", "/metrics", "/v1/anything")]
    guarded = Starlette(routes=routes)
    guarded.add_middleware(RunTokenMiddleware, token=token)
    return guarded


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "no run token"),
        ({"Authorization": "Bearer not-the-token"}, "a wrong run token"),
        ({"Authorization": f"Basic {TOKEN}"}, "no run token"),  # another scheme is no bearer token
        ({"Authorization": f"Bearer {TOKEN}x"}, "a wrong run token"),
    ],
)
def test_a_request_without_the_token_gets_401_in_openais_error_shape(headers: dict[str, str], reason: str) -> None:
    with TestClient(app()) as client:
        for method, path in (("GET", "/metrics"), ("POST", "/v1/anything")):
            response = client.request(method, path, headers=headers)
            assert response.status_code == 401
            assert response.headers["www-authenticate"] == "Bearer"
            error = response.json()["error"]
            assert error["type"] == "AuthenticationError" and error["code"] == 401 and error["param"] is None
            assert reason in error["message"] and path in error["message"]
            assert "reached" not in response.text


def test_the_token_opens_every_route_and_health_needs_none() -> None:
    with TestClient(app()) as client:
        for path in ("/metrics", "/v1/anything", "/health"):
            assert client.get(path, headers=authorization_header(TOKEN)).text == f"reached {path}"
        assert client.get("/health").text == "reached /health"  # liveness probes carry no secret


def test_the_middleware_reads_the_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """How vLLM's ``--middleware`` builds it: the class alone, the token in the process environment."""
    monkeypatch.setenv(RUN_TOKEN_ENV, "from-env")
    with TestClient(app(token=None)) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=authorization_header("from-env")).status_code == 200


def test_a_middleware_without_any_token_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUN_TOKEN_ENV, raising=False)
    with pytest.raises(RuntimeError, match=RUN_TOKEN_ENV), TestClient(app(token=None)) as client:
        client.get("/metrics")


def test_tokens_are_fresh_and_travel_in_the_environment() -> None:
    first, second = new_run_token(), new_run_token()
    assert first != second and len(first) >= 40  # 32 random bytes, URL-safe
    env = with_run_token({"PATH": "/bin"}, first)
    assert token_from_env(env) == first
    assert RUN_TOKEN_ENV not in with_run_token({RUN_TOKEN_ENV: "stale"}, None)  # no token: none inherited
    assert authorization_header(None) == {} and authorization_header("t") == {"Authorization": "Bearer t"}
