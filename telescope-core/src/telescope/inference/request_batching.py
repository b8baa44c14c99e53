"""Completion requests made together, sent to the server in one POST: one HTTP exchange per tick, not per sample.

Why. The orchestrator dispatches a group's samples at once, each as its own
completion request (its own seed, id, lane, timeline events). On a small model the
HTTP exchange of each, on both sides, costs about as much CPU as the model's work for
it: on the CPU quick start (then 64 requests a step) sending them batched took the server's
CPU per step from 137-141 to 119-121 ms and the orchestrator's from 59-60 to 46-50 ms,
and the median step from 218 to 200-207 ms. Here the requests a client is given in one event-loop
iteration (a group's 8, or several groups dispatched together) go out as one
``POST /v1/completions/batch`` (the embedded server's extension,
:class:`~telescope.inference.protocol.CompletionBatchRequest`), and the server answers
one NDJSON line per request *as each finishes*. Each request is still its own engine
request, so nothing about it changes: a sample's answer arrives when it finishes (its
lane is freed and its reward starts then, not when its group's slowest sample ends),
with its own seed, id, timing, finish reason and error.

Failures and cancellation:

- a refused request (a bad prompt) gets its own error line; the others run;
- the whole POST failing (connection refused or lost, a 503 after the client's
  retries, a truncated answer) fails every request still waiting, with that error;
- cancelling one caller aborts its request by id (one ``/abort_requests`` for the
  cancellations of one tick); once no caller waits, the connection is closed, and the
  server aborts whatever still runs (as for a single request);
- each caller waits at most the client's read timeout for its own line
  (``httpx.ReadTimeout``, its request then aborted), however long the others run.

A server without the route (vLLM answers 404 or 405) is remembered, and its requests
are sent one by one from then on (:attr:`RequestBatcher.supported`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pydantic

from telescope.inference.protocol import CompletionBatchLine, CompletionResponse

#: sends the bodies as one batch: an async context manager yielding the answer's lines as they arrive
SendBatch = Callable[[list[dict[str, Any]]], contextlib.AbstractAsyncContextManager[AsyncIterator[bytes]]]


class BatchRouteMissing(Exception):
    """The server has no batch route: send the requests one by one."""


class BatchLineError(Exception):
    """A request of a batch was refused: its own HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(eq=False)
class _Waiting:
    body: dict[str, Any]
    future: asyncio.Future[CompletionResponse]
    batch: _Batch | None = None


@dataclass(eq=False)
class _Batch:
    items: list[_Waiting]
    task: asyncio.Task[None] = field(init=False)  # set by the flush that creates the batch
    cancelled: list[str] = field(default_factory=list)


class RequestBatcher:
    """Coalesces one client's completion requests per event-loop iteration (see the module docstring)."""

    def __init__(self, send: SendBatch, abort: Callable[[list[str]], Awaitable[Any]]) -> None:
        self._send = send
        self._abort = abort
        self._waiting: list[_Waiting] = []
        self._background: set[asyncio.Task[Any]] = set()
        #: False once the server answered that it has no batch route
        self.supported = True
        #: POSTs sent (each carrying one or more requests)
        self.batches_sent = 0

    async def complete(self, body: dict[str, Any], timeout: float | None) -> CompletionResponse:
        """``body``'s response, sent with the other requests of this iteration.

        Raises :class:`BatchRouteMissing` (send it alone), :class:`BatchLineError` (this
        request was refused), ``TimeoutError`` (no answer within ``timeout``: the request
        is aborted) or the error that failed the whole POST.
        """
        loop = asyncio.get_running_loop()
        item = _Waiting(body, loop.create_future())
        self._waiting.append(item)
        if len(self._waiting) == 1:
            loop.call_soon(self._flush)
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the result
            # and swallows a cancellation that lands in the iteration the future completes
            async with asyncio.timeout(timeout):
                return await item.future
        except (asyncio.CancelledError, TimeoutError):
            self._withdraw(item)
            raise

    def _flush(self) -> None:
        items = [item for item in self._waiting if not item.future.done()]  # a caller may have left already
        self._waiting = []
        if not items:
            return
        batch = _Batch(items)
        for item in items:
            item.batch = batch
        batch.task = asyncio.ensure_future(self._run(batch))
        self.batches_sent += 1

    async def _run(self, batch: _Batch) -> None:
        items = batch.items
        try:
            async with self._send([item.body for item in items]) as lines:
                async for raw in lines:
                    item, line = self._match(items, raw)
                    if item.future.done():
                        continue
                    if line.response is not None:
                        item.future.set_result(line.response)
                    else:
                        item.future.set_exception(BatchLineError(line.status, line.error or "refused"))
            self._fail(items, httpx.RemoteProtocolError("the batch answer ended without this request's line"))
        except asyncio.CancelledError:
            for item in items:
                item.future.cancel()
            raise
        except BatchRouteMissing as exc:
            self.supported = False
            self._fail(items, exc)
        except Exception as exc:  # the whole POST failed: every request still waiting fails with it
            self._fail(items, exc)

    @staticmethod
    def _match(items: list[_Waiting], raw: bytes) -> tuple[_Waiting, CompletionBatchLine]:
        """The request a line of the answer is for; a malformed line is a transport error."""
        try:
            line = CompletionBatchLine.model_validate_json(raw)
        except pydantic.ValidationError as exc:
            raise httpx.RemoteProtocolError(f"a malformed line in the batch answer: {exc}") from exc
        if line.index >= len(items):
            raise httpx.RemoteProtocolError(f"the batch answer has a line for request {line.index} of {len(items)}")
        return items[line.index], line

    @staticmethod
    def _fail(items: list[_Waiting], exc: Exception) -> None:
        for item in items:
            if not item.future.done():
                item.future.set_exception(exc)

    def _withdraw(self, item: _Waiting) -> None:
        """A caller stopped waiting: abort its request (at the end of this iteration, with the others')."""
        batch = item.batch
        if batch is None or batch.task.done():
            return  # not sent yet (the flush skips it) or already over
        batch.cancelled.append(str(item.body["request_id"]))
        if len(batch.cancelled) == 1:
            asyncio.get_running_loop().call_soon(self._settle, batch)

    def _settle(self, batch: _Batch) -> None:
        ids, batch.cancelled = batch.cancelled, []
        if batch.task.done():
            return
        if all(item.future.done() for item in batch.items):
            batch.task.cancel()  # nobody waits: closing the connection aborts what still runs
            return
        task = asyncio.ensure_future(self._abort_quietly(ids))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort_quietly(self, ids: list[str]) -> None:
        with contextlib.suppress(Exception):  # best effort: the server may be gone; the run goes on
            await self._abort(ids)
