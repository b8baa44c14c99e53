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
  body) or the answer is malformed: ``httpx.RemoteProtocolError`` /
  ``httpx.ReadError`` (transport errors, not retried: the caller decides).

:meth:`AiohttpTransport.post_json` is the hot path of the client's POSTs (every
completion): the same request and error mapping without building an ``httpx.Request``
and going through ``httpx.AsyncClient``'s URL merging, cookie jar, auth and redirect
layers, which cost the orchestrator more CPU than aiohttp's own work per request.

Responses are read whole (every route the client calls answers a small JSON body),
so no stream outlives :meth:`AiohttpTransport.handle_async_request`; the one answer
read as it arrives is a batch of completions (:meth:`AiohttpTransport.open_post`, a
line per request, see :mod:`telescope.inference.request_batching`). Cancelling the
awaiting task while a response is pending closes that connection (aiohttp does not
return a half-read connection to its pool), which is how the servers learn that a
request was aborted. Limits: HTTP/1.1 only, no proxies, no client certificates
(the inference servers are plain HTTP on the cluster network).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from types import MappingProxyType

import aiohttp
import httpx

#: Response headers dropped because aiohttp has already undone them.
_CONSUMED_HEADERS = {b"content-encoding", b"transfer-encoding", b"content-length"}
#: The headers of a JSON POST.
JSON_HEADERS: Mapping[str, str] = MappingProxyType({"Content-Type": "application/json"})


@contextlib.contextmanager
def mapped_errors(request: httpx.Request | Callable[[], httpx.Request]) -> Iterator[None]:
    """Re-raise aiohttp's errors as the httpx exception of the same meaning (see the module docstring).

    ``request`` may be a function that makes it: it is then built only for an error.
    """
    try:
        yield
    except (aiohttp.ClientConnectorError, aiohttp.InvalidURL) as exc:
        raise httpx.ConnectError(str(exc), request=_made(request)) from exc
    except aiohttp.ConnectionTimeoutError as exc:  # before the request went out
        raise httpx.ConnectTimeout(str(exc) or "connect timed out", request=_made(request)) from exc
    except TimeoutError as exc:  # sock_read (SocketTimeoutError) or any other wait once connected
        raise httpx.ReadTimeout(str(exc) or "read timed out", request=_made(request)) from exc
    except aiohttp.ServerDisconnectedError as exc:
        raise httpx.RemoteProtocolError(str(exc) or "server disconnected", request=_made(request)) from exc
    except aiohttp.ClientResponseError as exc:  # a malformed status line or headers
        raise httpx.RemoteProtocolError(str(exc) or "malformed answer", request=_made(request)) from exc
    except (aiohttp.ClientPayloadError, aiohttp.ClientOSError, aiohttp.ClientConnectionError) as exc:
        raise httpx.ReadError(str(exc) or type(exc).__name__, request=_made(request)) from exc


def _made(request: httpx.Request | Callable[[], httpx.Request]) -> httpx.Request:
    return request if isinstance(request, httpx.Request) else request()


def _client_timeout(timeout: dict[str, float | None]) -> aiohttp.ClientTimeout:
    """httpx's timeout keys as aiohttp's: ``pool`` waits for a connection, ``connect`` for the socket."""
    return aiohttp.ClientTimeout(
        total=None, connect=timeout.get("pool"), sock_connect=timeout.get("connect"), sock_read=timeout.get("read")
    )


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
        session = self._session_for_loop()
        client_timeout = _client_timeout(request.extensions.get("timeout", {}))
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

    async def post_json(
        self, url: str, body: bytes, timeout: dict[str, float | None], headers: Mapping[str, str] = JSON_HEADERS
    ) -> httpx.Response:
        """``POST url`` with a JSON ``body``; the whole answer as an ``httpx.Response`` (errors mapped the same way).

        ``timeout``: httpx's keys (``connect``, ``read``, ``pool``), as ``handle_async_request`` reads them;
        ``headers``: the request's (the client adds its ``Authorization`` to :data:`JSON_HEADERS`).
        """
        session = self._session_for_loop()
        client_timeout = _client_timeout(timeout)
        with mapped_errors(lambda: httpx.Request("POST", url)):
            async with session.post(
                url, data=body, headers=headers, allow_redirects=False, timeout=client_timeout
            ) as response:
                return httpx.Response(status_code=response.status, content=await response.read())

    async def open_post(
        self, url: str, body: bytes, timeout: dict[str, float | None], headers: Mapping[str, str] = JSON_HEADERS
    ) -> StreamedResponse:
        """``POST url`` with a JSON ``body``; the answer once its headers are in, its body still to read.

        The caller reads it (:meth:`StreamedResponse.lines` or :meth:`~StreamedResponse.text`)
        and must :meth:`~StreamedResponse.close` it. ``headers`` as for :meth:`post_json`.
        """
        session = self._session_for_loop()
        client_timeout = _client_timeout(timeout)

        def request() -> httpx.Request:
            return httpx.Request("POST", url)

        with mapped_errors(request):
            response = await session.post(
                url, data=body, headers=headers, allow_redirects=False, timeout=client_timeout
            )
        return StreamedResponse(response, request)

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            with contextlib.suppress(RuntimeError, asyncio.CancelledError):  # its loop may be gone already
                await self._session.close()
        self._session = None


class StreamedResponse:
    """An answer read as it arrives (a batch of completions answers a line per request as each finishes)."""

    def __init__(self, response: aiohttp.ClientResponse, request: Callable[[], httpx.Request]) -> None:
        self._response = response
        self._request = request
        self.status = response.status

    async def text(self) -> str:
        with mapped_errors(self._request):
            return (await self._response.read()).decode("utf-8", errors="replace")

    async def lines(self) -> AsyncIterator[bytes]:
        """The body's non-empty lines, each as soon as it is complete (no line length limit)."""
        buffer = bytearray()
        with mapped_errors(self._request):
            async for chunk in self._response.content.iter_any():
                buffer += chunk
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if line.strip():
                        yield line
        if buffer.strip():
            yield bytes(buffer)

    def close(self) -> None:
        """Back to the pool when read to the end; otherwise the connection is closed (the server sees it go)."""
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()
