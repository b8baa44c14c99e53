"""Fixtures of the environment tests: a local fake HTTP service (no network is ever reached)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


#: A route: request -> (status, content type, body); a dict or list body is sent as JSON.
Route = Callable[[Request], tuple[int, str, Any]]


@dataclass
class FakeHTTP:
    """An HTTP server on 127.0.0.1 answering from ``routes`` ({(method, path): route}); records requests."""

    routes: dict[tuple[str, str], Route] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    base_url: str = ""

    def route(self, method: str, path: str, handler: Route) -> None:
        self.routes[(method, path)] = handler

    def json_route(self, method: str, path: str, payload: Any, status: int = 200) -> None:
        self.routes[(method, path)] = lambda _request: (status, "application/json", payload)


@pytest.fixture
def fake_http() -> Iterator[FakeHTTP]:
    fake = FakeHTTP()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            request = Request(self.command, self.path, dict(self.headers.items()), self.rfile.read(length))
            fake.requests.append(request)
            handler = fake.routes.get((self.command, self.path))
            status, content_type, body = handler(request) if handler else (404, "text/plain", "no such route")
            data = json.dumps(body).encode() if isinstance(body, dict | list) else str(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _serve  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    yield fake
    server.shutdown()
    server.server_close()
