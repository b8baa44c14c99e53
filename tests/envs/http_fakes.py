"""A local fake HTTP service for the environment tests (no network is ever reached); ``fake_http`` serves it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


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
