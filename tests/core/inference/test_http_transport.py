"""The aiohttp transport keeps httpx's error meanings, so the client retries only what is safe to repeat."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import httpx
import pytest

from telescope.inference.client import InferenceClient

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serve(handler: Handler) -> tuple[asyncio.Server, str, list[int]]:
    connections: list[int] = []

    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await handler(reader, writer)

    server = await asyncio.start_server(counted, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}", connections


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
    await reader.readexactly(length)


def test_a_server_that_hangs_up_after_the_request_is_not_retried() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.close()

    async def go() -> tuple[BaseException, list[int]]:
        server, url, connections = await _serve(hang_up)
        async with server, InferenceClient(url, max_retries=4) as client:
            with pytest.raises(httpx.TransportError) as caught:
                await client.complete([1, 2, 3], max_tokens=2)
        return caught.value, connections

    error, connections = asyncio.run(go())
    assert isinstance(error, httpx.RemoteProtocolError | httpx.ReadError), type(error)
    assert not isinstance(error, httpx.ConnectError | httpx.ConnectTimeout)
    assert len(connections) == 1  # a completion is not free to repeat


def test_a_refused_connection_is_a_connect_error_and_is_retried() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there

    async def go() -> None:
        async with InferenceClient(f"http://127.0.0.1:{port}", max_retries=2) as client:
            await client.complete([1], max_tokens=1)

    with pytest.raises(httpx.ConnectError):
        asyncio.run(go())


def test_no_answer_within_the_read_timeout_is_a_read_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)

    async def go() -> list[int]:
        server, url, connections = await _serve(silent)
        async with server, InferenceClient(url, read_timeout=0.2) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.complete([1], max_tokens=1)
        return connections

    assert len(asyncio.run(go())) == 1


def test_a_plain_answer_comes_back_whole() -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        body = b'{"data": [{"id": "tiny"}]}'
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()

    async def go() -> list[str]:
        server, url, _ = await _serve(answer)
        async with server, InferenceClient(url) as client:
            return await client.models()

    assert asyncio.run(go()) == ["tiny"]
