"""The client's request batching: one POST per event-loop iteration, each request still answered on its own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from inference_helpers import advance, idle_metrics, until_queued

from telescope.inference.client import InferenceClient, InferenceServerError
from telescope.inference.embedded.engine import Engine
from telescope.inference.embedded.server import ServerThread
from telescope.inference.request_batching import RequestBatcher


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_completions_of_one_iteration_share_one_post_and_equal_single_requests(server: ServerThread) -> None:
    async def go() -> tuple[list[Any], list[Any], int]:
        async with (
            InferenceClient(server.base_url) as batched,
            InferenceClient(server.base_url, batch_requests=False) as single,
        ):
            asked = [dict(max_tokens=6 + i, seed=100 + i, ignore_eos=True) for i in range(8)]
            together = await asyncio.gather(*(batched.complete([5, 6, 7], **a) for a in asked))
            alone = [await single.complete([5, 6, 7], **a) for a in asked]
            assert batched._batcher is not None and single._batcher is None
            return together, alone, batched._batcher.batches_sent

    together, alone, posts = run(go())
    assert posts == 1
    assert len({r.request_id for r in together}) == 8
    for i, (a, b) in enumerate(zip(together, alone, strict=True)):
        assert len(a.completions[0].token_ids) == 6 + i
        assert a.completions[0].token_ids == b.completions[0].token_ids  # same seed, same tokens
        assert a.completions[0].logprobs == pytest.approx(b.completions[0].logprobs, abs=1e-5)
        assert a.timing is not None and a.timing.finished is not None


def test_each_request_is_answered_when_it_finishes(server: ServerThread, engine: Engine) -> None:
    """A short request of a batch returns while a long one of the same POST still runs."""

    async def go() -> tuple[int, float, int]:
        async with InferenceClient(server.base_url) as client:
            with engine.paused():  # the long request moves only with the steps taken here
                long = asyncio.ensure_future(client.complete([5, 6], max_tokens=400, ignore_eos=True))
                short = asyncio.ensure_future(client.complete([5, 6], max_tokens=2, ignore_eos=True))
                await until_queued(engine, 2)
                advance(engine, 4)
                answered = await asyncio.wait_for(short, 30)
                running = (await client.metrics())["vllm:num_requests_running"]
                assert not long.done()
                long.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await long
            assert client._batcher is not None
            return len(answered.completions[0].token_ids), running, client._batcher.batches_sent

    tokens, running, posts = run(go())
    assert posts == 1  # both went in one POST
    assert tokens == 2 and running == 1


def test_cancelling_one_request_aborts_it_and_the_others_finish(server: ServerThread, engine: Engine) -> None:
    async def go() -> tuple[dict[str, float], dict[str, float], Any]:
        async with InferenceClient(server.base_url) as client:
            before = await idle_metrics(client)
            with engine.paused():  # both run, and neither can finish before the cancel
                doomed = asyncio.ensure_future(client.complete([5, 6], max_tokens=450, ignore_eos=True))
                kept = asyncio.ensure_future(client.complete([5, 7], max_tokens=60, ignore_eos=True))
                await until_queued(engine, 2)
                advance(engine, 3)
                doomed.cancel()
            result = await kept
            return before, await idle_metrics(client), result

    before, after, result = run(go())
    assert len(result.completions[0].token_ids) == 60
    assert after["telescope:requests_aborted_total"] - before["telescope:requests_aborted_total"] == 1
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 450 + 60


def test_cancelling_every_request_closes_the_post_and_aborts_them(server: ServerThread, engine: Engine) -> None:
    async def go() -> tuple[dict[str, float], dict[str, float]]:
        async with InferenceClient(server.base_url) as client:
            before = await idle_metrics(client)
            with engine.paused():  # both run, and neither can finish before the cancel
                asked = ([5, 6], [5, 7])
                tasks = [asyncio.ensure_future(client.complete(p, max_tokens=450, ignore_eos=True)) for p in asked]
                await until_queued(engine, 2)
                advance(engine, 3)
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            return before, await idle_metrics(client)

    before, after = run(go())
    assert after["vllm:num_requests_running"] == 0
    assert after["telescope:requests_aborted_total"] - before["telescope:requests_aborted_total"] == 2


def test_a_request_waits_at_most_the_read_timeout_for_its_own_answer(
    server: ServerThread, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each engine step takes at least 2 ms, so the 500-token request needs at least 1 s, well past the 0.3 s read
    # timeout, and the 2-token one a few steps (the tiny model alone decodes 500 tokens in about 0.25 s)
    step = engine._step

    def slow_step() -> None:
        time.sleep(0.002)
        step()

    monkeypatch.setattr(engine, "_step", slow_step)

    async def go() -> tuple[Any, BaseException, dict[str, float], dict[str, float]]:
        # the metrics go through a client of its own: only the completions carry the short read timeout
        async with (
            InferenceClient(server.base_url, read_timeout=0.3) as client,
            InferenceClient(server.base_url) as observer,
        ):
            before = await idle_metrics(observer)
            outcomes = await asyncio.gather(
                client.complete([5, 6], max_tokens=2, ignore_eos=True),
                client.complete([5, 6], max_tokens=500, ignore_eos=True),
                return_exceptions=True,
            )
            return outcomes[0], outcomes[1], before, await idle_metrics(observer)

    short, long, before, after = run(go())
    assert len(short.completions[0].token_ids) == 2
    assert isinstance(long, httpx.ReadTimeout)
    assert after["telescope:requests_aborted_total"] - before["telescope:requests_aborted_total"] == 1


def test_a_refused_request_fails_alone(server: ServerThread) -> None:
    async def go() -> list[Any]:
        async with InferenceClient(server.base_url) as client:
            return await asyncio.gather(
                client.complete([5, 6], max_tokens=3, model="no-such-model"),
                client.complete([5, 6], max_tokens=3),
                return_exceptions=True,
            )

    refused, served = run(go())
    assert isinstance(refused, InferenceServerError) and refused.status == 404 and "no-such-model" in str(refused)
    assert len(served.completions[0].token_ids) == 3


def test_an_invalid_request_gets_its_own_error_line(server: ServerThread) -> None:
    """A body the server's schema rejects (top_p 0) fails alone with 422; the batch's other request runs."""

    async def go() -> list[Any]:
        async with InferenceClient(server.base_url) as client:
            outcomes = await asyncio.gather(
                client.complete([5, 6], max_tokens=3, top_p=0.0),
                client.complete([5, 6], max_tokens=3),
                return_exceptions=True,
            )
            assert client._batcher is not None and client._batcher.batches_sent == 1
            return outcomes

    invalid, served = run(go())
    assert isinstance(invalid, InferenceServerError) and invalid.status == 422 and "top_p" in str(invalid)
    assert len(served.completions[0].token_ids) == 3


ANSWER = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 0,
    "model": "m",
    "choices": [
        {"index": 0, "text": "", "token_ids": [4], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "length"}
    ],
    "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
}


async def _raw_server(respond: Any) -> tuple[asyncio.Server, str, list[bytes]]:
    """An HTTP/1.1 server answering each request with ``respond(path, body)`` -> (raw bytes, then close?)."""
    paths: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-len")
                )
                body = await reader.readexactly(length)
                path = head.split(b" ")[1]
                paths.append(path)
                answer, close = respond(path, json.loads(body))
                writer.write(answer)
                await writer.drain()
                if close:  # the server dies in the middle of its answer
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", paths


def _outcomes(respond: Any, count: int) -> list[Any]:
    """``count`` one-token completions asked together of a raw server answering with ``respond``: results or errors."""

    async def go() -> list[Any]:
        server, url, _ = await _raw_server(respond)
        async with server, InferenceClient(url) as client:
            return await asyncio.gather(
                *(client.complete([1, 2], max_tokens=1) for _ in range(count)), return_exceptions=True
            )

    return run(go())


def _http(status: int, body: bytes) -> tuple[bytes, bool]:
    return b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body), False


def test_a_server_without_the_batch_route_gets_one_request_per_post() -> None:
    """vLLM has no batch route: its 404 sends the waiting requests alone, and every later one too."""

    def respond(path: bytes, body: dict[str, Any]) -> tuple[bytes, bool]:
        if path == b"/v1/completions/batch":
            return _http(404, b'{"detail": "Not Found"}')
        return _http(200, json.dumps(ANSWER).encode())

    async def go() -> tuple[list[Any], Any, list[bytes], bool]:
        server, url, paths = await _raw_server(respond)
        async with server, InferenceClient(url) as client:
            first = await asyncio.gather(*(client.complete([1, 2], max_tokens=1) for _ in range(3)))
            later = await client.complete([1, 2], max_tokens=1)
            assert client._batcher is not None
            return first, later, paths, client._batcher.supported

    first, later, paths, supported = run(go())
    assert [r.completions[0].token_ids for r in [*first, later]] == [[4]] * 4
    assert paths == [b"/v1/completions/batch"] + [b"/v1/completions"] * 4
    assert not supported


def test_a_batch_cut_off_midway_fails_the_requests_still_waiting() -> None:
    """The server dies after answering one request of three: that one keeps its answer, the others get the
    transport error (which the scheduler treats as an unavailable server)."""

    def respond(path: bytes, body: dict[str, Any]) -> tuple[bytes, bool]:
        line = json.dumps({"index": 1, "status": 200, "response": ANSWER}).encode() + b"\n"
        chunk = b"%x\r\n%s\r\n" % (len(line), line)
        return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk, True  # no last chunk

    outcomes = _outcomes(respond, 3)
    assert outcomes[1].completions[0].token_ids == [4]
    for failed in (outcomes[0], outcomes[2]):
        assert isinstance(failed, httpx.TransportError), failed


def test_a_malformed_chunk_in_the_batch_answer_is_a_transport_error() -> None:
    def respond(path: bytes, body: dict[str, Any]) -> tuple[bytes, bool]:
        return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nnot-a-chunk-size\r\n", True

    for failed in _outcomes(respond, 2):
        assert isinstance(failed, httpx.TransportError), failed


def test_a_batch_answer_that_ends_early_fails_the_missing_requests_as_a_transport_error() -> None:
    def respond(path: bytes, body: dict[str, Any]) -> tuple[bytes, bool]:
        line = json.dumps({"index": 0, "status": 200, "response": ANSWER}).encode() + b"\n"
        return _http(200, line)

    answered, missing = _outcomes(respond, 2)
    assert answered.completions[0].token_ids == [4]
    assert isinstance(missing, httpx.RemoteProtocolError) and "without this request" in str(missing)


@pytest.mark.parametrize(
    "line",
    [
        b"{}",
        b"not json",
        json.dumps({"index": 2, "status": 200, "response": ANSWER}).encode(),
        json.dumps({"index": -1, "status": 200, "response": ANSWER}).encode(),
    ],
    ids=["no-index", "not-json", "index-past-the-batch", "negative-index"],
)
def test_a_malformed_line_in_the_batch_answer_is_a_transport_error(line: bytes) -> None:
    """A line that names no request of the batch fails the batch as a transport error (the scheduler then
    re-dispatches), never another request's answer or an unmapped exception."""

    def respond(path: bytes, body: dict[str, Any]) -> tuple[bytes, bool]:
        return _http(200, line + b"\n")

    for failed in _outcomes(respond, 2):
        assert isinstance(failed, httpx.RemoteProtocolError), failed


def test_a_cancel_in_the_iteration_the_answer_arrives_is_not_lost() -> None:
    """The caller is cancelled right after its line arrived, before it resumed: it must see the cancellation
    (Python 3.11's ``asyncio.wait_for`` returned the result instead, so a stale rollout went on)."""

    async def go() -> tuple[BaseException | None, list[list[str]]]:
        aborted: list[list[str]] = []
        caller: asyncio.Task[Any] | None = None

        @contextlib.asynccontextmanager
        async def send(bodies: list[dict[str, Any]]) -> AsyncIterator[AsyncIterator[bytes]]:
            async def lines() -> AsyncIterator[bytes]:
                yield json.dumps({"index": 0, "status": 200, "response": ANSWER}).encode()
                assert caller is not None
                caller.cancel()  # the answer is set; the caller has not run since
                await asyncio.sleep(10)  # the second request still runs

            yield lines()

        async def abort(ids: list[str]) -> None:
            aborted.append(ids)

        batcher = RequestBatcher(send, abort)
        caller = asyncio.ensure_future(batcher.complete({"request_id": "a"}, timeout=60.0))
        other = asyncio.ensure_future(batcher.complete({"request_id": "b"}, timeout=60.0))
        outcome = (await asyncio.gather(caller, return_exceptions=True))[0]
        await asyncio.sleep(0)
        other.cancel()
        await asyncio.gather(other, return_exceptions=True)
        return outcome, aborted

    outcome, aborted = run(go())
    assert isinstance(outcome, asyncio.CancelledError)
    assert aborted == [["a"]]
