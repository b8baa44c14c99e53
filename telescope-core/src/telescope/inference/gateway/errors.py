"""OpenAI's error JSON for every failure the gateway answers.

Every error leaves as ``{"error": {"message", "type", "param", "code"}}`` with the status
the OpenAI SDK maps to its exception classes (400 ``BadRequestError``, 401
``AuthenticationError``, 404 ``NotFoundError``, 429 ``RateLimitError``, 503
``InternalServerError``). A request body that fails validation is a 400 whose ``param``
names the field (``messages[1].role``); an unexpected exception is logged here and
answered as a 500 with its class name only, never a traceback.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
}


class GatewayError(Exception):
    """A failure to answer as OpenAI does: ``status``, a message saying what and how to fix, the field."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, param=self.param, code=self.code)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(status: int, message: str, *, param: str | None = None, code: str | None = None) -> JSONResponse:
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse(error_body(status, message, param=param, code=code), status, headers=headers)


def field_path(loc: Sequence[int | str]) -> str:
    """``("body", "messages", 1, "role")`` -> ``messages[1].role`` (the field as the caller wrote it)."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not out:
            out = str(part)
        elif part.startswith(("function-after[", "function-before[")) or "[" in part:
            continue  # a validator's own name in pydantic's location, not a field
        else:
            out += f".{part}"
    return out


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """The first problem of ``exc`` as (message naming the field, the field)."""
    errors = exc.errors()
    if not errors:
        return "invalid request body", None
    first = errors[0]
    param = field_path(first.get("loc", ())) or None
    reason = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    named = re.match(r"^([a-z_]+): (.*)$", reason, re.DOTALL)
    if param is None and named is not None:  # a rule across fields names its field first ("tool_choice: ...")
        param, reason = named.group(1), named.group(2)
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {reason}", None
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return f"invalid value for {param or 'the request body'}: {reason}{more}", param


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error of ``app`` in OpenAI's shape (see the module docstring)."""

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc)
        return error_response(400, message, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}; the gateway serves /v1/chat/completions, "
            message += "/v1/completions and /v1/models"
        return error_response(exc.status_code, message)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("gateway: %s %s failed", request.method, request.url.path)
        return error_response(500, f"internal error ({type(exc).__name__}); the gateway's log has the details")
