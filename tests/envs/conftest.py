"""Fixtures of the environment tests: ``fake_http``, a local fake HTTP service (see ``http_fakes``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from http_fakes import FakeHTTP, Request


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

        do_GET = do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    yield fake
    server.shutdown()
    server.server_close()
