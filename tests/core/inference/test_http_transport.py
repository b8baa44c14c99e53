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


def test_a_completion_posts_json_straight_through_aiohttp_and_a_mock_transport_still_works() -> None:
    seen: list[bytes] = []
    answer = (
        b'{"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m", "choices": [{"index": 0,'
        b' "text": "", "token_ids": [4], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "length"}],'
        b' "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}'
    )

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length"))
        seen.append(head.split(b"\r\n")[0])
        seen.append(b"json" if b"content-type: application/json" in head.lower() else b"not json")
        seen.append(await reader.readexactly(length))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(answer), answer))
        await writer.drain()
        writer.close()

    async def go() -> list[int]:
        server, url, _ = await _serve(record)
        async with server, InferenceClient(url, batch_requests=False) as client:
            assert client._direct is not None  # the direct path of a single POST is the one under test
            result = await client.complete([1, 2, 3], max_tokens=1, seed=5)
        return result.completions[0].token_ids

    assert asyncio.run(go()) == [4]
    import json

    assert seen[0] == b"POST /v1/completions HTTP/1.1" and seen[1] == b"json"
    body = json.loads(seen[2])
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 1 and body["seed"] == 5
    assert body["request_id"].startswith("cmpl-")

    def mock(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["prompt"] == [7]
        return httpx.Response(200, content=answer)

    async def through_mock() -> list[int]:
        async with InferenceClient("http://mock", http_transport=httpx.MockTransport(mock)) as client:
            assert client._direct is None
            return (await client.complete([7], max_tokens=1)).completions[0].token_ids

    assert asyncio.run(through_mock()) == [4]


def test_request_ids_are_unique() -> None:
    from telescope.inference.protocol import new_request_id

    ids = {new_request_id() for _ in range(10_000)}
    assert len(ids) == 10_000
