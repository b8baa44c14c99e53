"""Conformance kit for inference backends: inherit, give a backend factory, run pytest.

Usage, in an inference backend package's tests::

    from telescope.testing.inference import InferenceBackendConformance

    class TestMyBackend(InferenceBackendConformance):
        def make_backend(self, model_path, port):
            return MyBackend(InferenceContext(model=str(model_path), base_port=port, max_model_len=256))

The kit starts one server (worker 0) on a tiny local model for the whole class
and checks, through the orchestrator's own client (:class:`telescope.inference.client.InferenceClient`),
the contract of :mod:`telescope.api.inference`:

- ``/health`` answers 200 and ``/metrics`` exposes the vLLM metric names the
  run reads (running and waiting requests, KV-cache use);
- a completion from token ids returns as many log-probabilities as tokens, at
  most ``max_tokens`` of them, finite and <= 0, a finish reason, and the policy
  versions;
- the same seed gives the same tokens;
- cancelling a request (closing its connection) aborts it on the server;
- a weight update through the ``memory`` transport is loaded in place: the
  server's policy version moves and its output changes;
- given the run token (``context.access_token``), the server answers 401 without it
  (generation, metrics, weight calls) and keeps ``/health`` open;
- ``stop`` releases the port.

``model_path`` is a tiny model the kit builds locally (``tiny:test``). The tests
take seconds each; the whole class is marked ``slow``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from telescope.api.inference import InferenceBackend, InferenceServer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
class InferenceBackendConformance:
    """Base class of an inference backend's conformance tests (pytest collects the subclass)."""

    prompt: list[int] = [1, 5, 9, 13, 17]  # noqa: RUF012 (read-only in the kit)

    def make_backend(self, model_path: Path, port: int) -> InferenceBackend:
        raise NotImplementedError("a conformance test class must define make_backend(model_path, port)")

    @pytest.fixture(scope="class")
    @classmethod
    def started(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InferenceServer, Path]]:
        from telescope.models.tiny import resolve_model_path

        model_path = Path(resolve_model_path("tiny:test"))
        port = free_port()
        server = cls().make_backend(model_path, port).start_server(0, tmp_path_factory.mktemp("inference-run"))
        yield server, model_path
        server.stop()

    @staticmethod
    def _run(coroutine: Any) -> Any:
        return asyncio.run(coroutine)

    def _client(self, server: InferenceServer) -> Any:
        from telescope.inference.client import InferenceClient

        return InferenceClient(server.address.base_url)

    # ------------------------------------------------------------------ tests
    def test_health_and_metrics(self, started: tuple[InferenceServer, Path]) -> None:
        server, _ = started

        async def check() -> dict[str, float]:
            async with self._client(server) as client:
                assert await client.health()
                metrics: dict[str, float] = await client.metrics()
                return metrics

        metrics = self._run(check())
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
            assert name in metrics, f"/metrics lacks {name}"

    def test_completion_from_token_ids(self, started: tuple[InferenceServer, Path]) -> None:
        server, _ = started

        async def complete() -> Any:
            async with self._client(server) as client:
                return await client.complete(self.prompt, max_tokens=8, temperature=1.0, seed=3)

        completion = self._run(complete()).completions[0]
        assert 1 <= len(completion.token_ids) <= 8
        assert len(completion.logprobs) == len(completion.token_ids)
        assert all(math.isfinite(lp) and lp <= 1e-6 for lp in completion.logprobs)
        assert completion.finish_reason in ("stop", "length")
        assert completion.policy_version_start <= completion.policy_version_end

    def test_same_seed_same_tokens(self, started: tuple[InferenceServer, Path]) -> None:
        server, _ = started

        async def twice() -> tuple[list[int], list[int]]:
            async with self._client(server) as client:
                a = await client.complete(self.prompt, max_tokens=12, temperature=1.0, seed=11)
                b = await client.complete(self.prompt, max_tokens=12, temperature=1.0, seed=11)
                return a.completions[0].token_ids, b.completions[0].token_ids

        first, second = self._run(twice())
        assert first == second

    def test_cancelled_request_is_aborted_on_the_server(self, started: tuple[InferenceServer, Path]) -> None:
        server, _ = started

        async def cancel() -> float:
            async with self._client(server) as client:
                for _attempt in range(5):  # a fast server can finish the request between two polls: try again
                    task = asyncio.create_task(
                        client.complete(self.prompt, max_tokens=240, temperature=1.0, seed=1, ignore_eos=True)
                    )
                    for _ in range(600):  # cancel once the server runs it (a fixed sleep raced a fast server)
                        if (await client.metrics()).get("vllm:num_requests_running", 0.0) >= 1 or task.done():
                            break
                        await asyncio.sleep(0.01)
                    if not task.done():
                        break
                assert not task.done(), "the request finished before it could be cancelled, five times"
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                for _ in range(300):  # the server notices the closed connection at its next step (30 s bound)
                    running = (await client.metrics()).get("vllm:num_requests_running", 0.0)
                    if running == 0:
                        return running
                    await asyncio.sleep(0.1)
                return running

        assert self._run(cancel()) == 0, "a cancelled request kept running on the server"

    def test_weight_update_is_loaded_in_place(self, started: tuple[InferenceServer, Path]) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from telescope.transports.memory import MemoryTransport

        server, model_path = started
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
        sender = MemoryTransport()
        info = sender.prepare_sender(1)

        async def update() -> tuple[list[int], list[int], int]:
            async with self._client(server) as client:
                before = await client.complete(self.prompt, max_tokens=6, temperature=0.0)
                await client.init_weight_transfer("memory", info, 1)
                with torch.no_grad():
                    weights = [(n, torch.randn_like(p) * 0.5) for n, p in model.named_parameters()]
                receiving = asyncio.create_task(client.update_weights(7))
                await asyncio.to_thread(sender.send, weights, 7)
                await receiving
                after = await client.complete(self.prompt, max_tokens=6, temperature=0.0)
                return (
                    before.completions[0].token_ids,
                    after.completions[0].token_ids,
                    await client.get_policy_version(),
                )

        try:
            before, after, version = self._run(update())
        finally:
            sender.close()
        assert version == 7
        assert before != after, "new weights did not change the output: the update was not loaded"

    def test_a_server_asks_for_the_run_token(self, tmp_path: Path) -> None:
        """With ``context.access_token`` set, every route the client uses but ``/health`` answers 401 without it."""
        from telescope.inference.client import InferenceClient, InferenceServerError
        from telescope.models.tiny import resolve_model_path

        made = self.make_backend(Path(resolve_model_path("tiny:test")), free_port())
        # built again as the run builds a backend: its constructor, the context with the run token
        backend = type(made)(dataclasses.replace(made.context, access_token="conformance-run-token"), made.settings)
        server = backend.start_server(0, tmp_path)

        async def refused_and_served() -> tuple[list[int], int]:
            async with InferenceClient(server.address.base_url, access_token="not-the-run-token") as stranger:
                assert await stranger.health(), "/health must stay open for liveness probes"
                statuses = []
                generation = stranger.complete(self.prompt, max_tokens=2)
                for call in (generation, stranger.metrics(), stranger.get_policy_version()):
                    with pytest.raises(InferenceServerError) as refused:
                        await call
                    statuses.append(refused.value.status)
            async with InferenceClient(server.address.base_url, access_token="conformance-run-token") as client:
                served = await client.complete(self.prompt, max_tokens=2, ignore_eos=True)
                return statuses, len(served.completions[0].token_ids)

        try:
            statuses, generated = self._run(refused_and_served())
        finally:
            server.stop()
        assert statuses == [401, 401, 401]
        assert generated == 2

    def test_stop_releases_the_port(self, tmp_path: Path) -> None:
        from telescope.models.tiny import resolve_model_path

        port = free_port()
        server = self.make_backend(Path(resolve_model_path("tiny:test")), port).start_server(0, tmp_path)
        server.stop()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # raises if the server still holds it


__all__ = ["InferenceBackendConformance", "free_port"]
