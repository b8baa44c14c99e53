"""Generation on the run's inference servers: the handle the orchestrator and the evals use.

:class:`GenerationService` is what the orchestrator (:mod:`telescope.orchestrator`)
and ``telescope eval`` generate through: one completion of a token prompt on server
``i``, with the run's :class:`SamplingSettings`, as a :class:`Generation` (tokens,
log-probabilities, the policy version of each token). :class:`ServerPool` implements
it over one :class:`~telescope.inference.client.InferenceClient` per server (what a
run and ``telescope eval`` use); tests implement it with in-process fakes.

Faults, told apart for the scheduler: a server that cannot serve raises
:class:`ServerUnavailable` (the work belongs on another server: the group is
re-dispatched); a request with no answer within the client's read timeout raises
:class:`~telescope.system.timeouts.OperationTimeout` (kind ``inference_request``:
that rollout is errored and counted). Optional capabilities are methods with
defaults: ``is_available(server)`` (default: always), ``fault_metrics()`` (counters
for the step's metrics; default: none) and ``probe()`` (the watchdog's findings on
each server, see :mod:`telescope.orchestrator.watchdog`; default: none).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from telescope.api.records import FinishReason
from telescope.system.timeouts import OperationTimeout

__all__ = [
    "Generation",
    "GenerationService",
    "SamplingSettings",
    "ServerPool",
    "ServerUnavailable",
    "complete_on",
]


@dataclass
class Generation:
    """What the inference client returns for one completion."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version_start: int | None = None
    policy_version_end: int | None = None
    token_policy_versions: list[int] | None = None


class ServerUnavailable(RuntimeError):
    """The inference server cannot serve (it died or is restarting); the work belongs on another server."""

    def __init__(self, server: int, reason: str) -> None:
        super().__init__(f"inference server {server} is unavailable: {reason}")
        self.server = server


@dataclass(frozen=True)
class SamplingSettings:
    """Per-request sampling parameters (training, or an eval's overrides)."""

    temperature: float
    top_p: float | None


async def complete_on(
    client: Any,
    prompt_ids: list[int],
    max_tokens: int,
    *,
    seed: int,
    priority: int,
    sampling: SamplingSettings,
    scheduling_policy: str,
) -> Generation:
    """One completion through an :class:`~telescope.inference.client.InferenceClient`, as a Generation.

    ``priority`` is sent only under the ``priority`` scheduling policy (``fcfs`` ignores it).
    """
    result = await client.complete(
        prompt_ids,
        max_tokens=max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=seed,
        priority=priority if scheduling_policy == "priority" else 0,
    )
    completion = result.completions[0]
    finish: FinishReason = "length" if completion.finish_reason == "length" else "stop"
    return Generation(
        completion.token_ids,
        completion.logprobs,
        finish,
        completion.policy_version_start,
        completion.policy_version_end,
        completion.token_policy_versions,
    )


class GenerationService(ABC):
    """The inference servers behind a run (or behind ``telescope eval``)."""

    @property
    @abstractmethod
    def num_servers(self) -> int: ...

    @abstractmethod
    async def generate(
        self,
        server: int,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        seed: int,
        priority: int,
        sampling: SamplingSettings,
    ) -> Generation:
        """One completion of ``prompt_ids`` on server ``server``; cancelling aborts it."""

    def is_available(self, server: int) -> bool:
        """Whether ``server`` takes work now (a server being restarted does not)."""
        return True

    def fault_metrics(self) -> dict[str, float]:
        """Fault counters for the step's metrics."""
        return {}

    async def probe(self) -> list[dict[str, Any]]:
        """The watchdog's findings on each server (:mod:`telescope.orchestrator.watchdog`)."""
        return []


class ServerPool(GenerationService):
    """The :class:`GenerationService` over one inference client per server (what a run and ``telescope eval`` use).

    Failures, told apart for the scheduler: a request that gets no answer within the
    client's read timeout (``inference_request_timeout_s``) raises
    :class:`~telescope.system.timeouts.OperationTimeout` (kind
    ``inference_request``: that rollout is errored and counted); a connection refused
    or dropped, or a server marked unavailable (a supervisor is restarting it, see
    :mod:`telescope.runtime.supervisor`), raises
    :class:`ServerUnavailable` (the group is
    re-dispatched). ``on_failure`` is told which server failed a request, so a
    supervisor can check it at once rather than at its next health check.
    """

    def __init__(self, clients: list[Any], scheduling_policy: str) -> None:
        self.clients = clients
        self.scheduling_policy = scheduling_policy
        self.unavailable: dict[int, str] = {}  # server -> why it takes no requests now
        self.on_failure: Callable[[int], None] | None = None

    @property
    def num_servers(self) -> int:
        return len(self.clients)

    def is_available(self, server: int) -> bool:
        return server not in self.unavailable

    def set_unavailable(self, server: int, reason: str | None) -> None:
        """Take ``server`` out of service (``reason``), or back in (None)."""
        if reason is None:
            self.unavailable.pop(server, None)
        else:
            self.unavailable[server] = reason

    async def generate(
        self,
        server: int,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        seed: int,
        priority: int,
        sampling: SamplingSettings,
    ) -> Generation:
        import httpx

        from telescope.inference.client import InferenceServerError

        if server in self.unavailable:
            raise ServerUnavailable(server, self.unavailable[server])
        client = self.clients[server]
        try:
            return await complete_on(
                client,
                prompt_ids,
                max_tokens,
                seed=seed,
                priority=priority,
                sampling=sampling,
                scheduling_policy=self.scheduling_policy,
            )
        except (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout) as exc:
            timeout = getattr(client, "read_timeout", None) or 0.0
            raise OperationTimeout("inference_request", f"a completion on inference server {server}", timeout) from exc
        except httpx.TransportError as exc:  # refused, reset, closed mid-response: the server is gone
            self._failed(server)
            raise ServerUnavailable(server, f"{type(exc).__name__}: {exc}") from exc
        except InferenceServerError as exc:
            if exc.status != 503:
                raise
            self._failed(server)
            raise ServerUnavailable(server, str(exc)) from exc

    def _failed(self, server: int) -> None:
        if self.on_failure is not None:
            with contextlib.suppress(Exception):
                self.on_failure(server)

    async def aclose(self) -> None:
        """Close every client's connections (the servers keep running)."""
        for client in self.clients:
            with contextlib.suppress(Exception):
                await client.aclose()
        self.clients = []
