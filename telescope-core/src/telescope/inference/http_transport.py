"""An ``httpx`` transport over ``aiohttp``: the orchestrator's HTTP without httpcore's pool cost.

Why. The orchestrator keeps hundreds of completions in flight per server. httpcore
(httpx's default transport) walks every pooled connection on each request it
assigns and each it releases (``is_idle``, ``has_expired``, a ``getpeername`` per
connection), so its cost grows with the square of the requests in flight: profiled
on the CPU quick start it was over 40% of the orchestrator process, more CPU than
the rollouts, rewards and scheduling together. aiohttp's connector hands out a free
connection in constant time. The client keeps httpx's API (requests, responses,
timeouts, exception types) so callers and tests are unchanged; only the transport
differs, and tests can still pass their own (``httpx.MockTransport``).

Why not the ``httpx-aiohttp`` package: it maps every ``aiohttp.ClientConnectionError``,
a server that disconnects in the middle of a response included, to
``httpx.ConnectTimeout``, which the client's retry policy treats as "the server is not
up yet" and repeats; a completion is not free to repeat. Here the mapping keeps
httpx's meaning (:func:`mapped_errors`):

- no connection could be made (refused, unreachable, name not resolved):
  ``httpx.ConnectError``; the connection attempt timed out: ``httpx.ConnectTimeout``
  (both retried by the client);
- no answer within the read timeout: ``httpx.ReadTimeout``;
- the connection broke after the request went out (disconnect, reset, truncated
  body): ``httpx.RemoteProtocolError`` / ``httpx.ReadError`` (transport errors, not
  retried: the caller decides).

Responses are read whole (every route the client calls answers a small JSON body),
so no stream outlives :meth:`AiohttpTransport.handle_async_request`. Cancelling the
awaiting task while a response is pending closes that connection (aiohttp does not
return a half-read connection to its pool), which is how the servers learn that a
request was aborted. Limits: HTTP/1.1 only, no proxies, no client certificates
(the inference servers are plain HTTP on the cluster network).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import aiohttp
import httpx

#: Response headers dropped because aiohttp has already undone them.
_CONSUMED_HEADERS = {b"content-encoding", b"transfer-encoding", b"content-length"}


@contextlib.contextmanager
def mapped_errors(request: httpx.Request) -> Iterator[None]:
    """Re-raise aiohttp's errors as the httpx exception of the same meaning (see the module docstring)."""
    try:
        yield
    except (aiohttp.ClientConnectorError, aiohttp.InvalidURL) as exc:
        raise httpx.ConnectError(str(exc), request=request) from exc
    except aiohttp.ConnectionTimeoutError as exc:  # before the request went out
        raise httpx.ConnectTimeout(str(exc) or "connect timed out", request=request) from exc
    except TimeoutError as exc:  # sock_read (SocketTimeoutError) or any other wait once connected
        raise httpx.ReadTimeout(str(exc) or "read timed out", request=request) from exc
    except aiohttp.ServerDisconnectedError as exc:
        raise httpx.RemoteProtocolError(str(exc) or "server disconnected", request=request) from exc
    except (aiohttp.ClientPayloadError, aiohttp.ClientOSError, aiohttp.ClientConnectionError) as exc:
        raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from exc


class AiohttpTransport(httpx.AsyncBaseTransport):
    """``httpx.AsyncBaseTransport`` on one ``aiohttp.ClientSession`` (created in the loop that first uses it)."""

    def __init__(self, max_connections: int = 4096, keepalive_s: float = 30.0) -> None:
        self._max_connections = max_connections
        self._keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None

    def _session_for_loop(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=self._keepalive_s)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True)
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions.get("timeout", {})
        session = self._session_for_loop()
        client_timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout.get("pool"), sock_connect=timeout.get("connect"),
            sock_read=timeout.get("read"),
        )  # fmt: skip
        body = await request.aread()
        with mapped_errors(request):
            async with session.request(
                request.method,
                str(request.url),
                headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw],
                data=body or None,
                allow_redirects=False,
                timeout=client_timeout,
            ) as response:
                content = await response.read()
                headers = [(k, v) for k, v in response.raw_headers if k.lower() not in _CONSUMED_HEADERS]
        return httpx.Response(status_code=response.status, headers=headers, content=content, request=request)

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            with contextlib.suppress(RuntimeError, asyncio.CancelledError):  # its loop may be gone already
                await self._session.close()
        self._session = None
