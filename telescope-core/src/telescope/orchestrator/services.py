"""What the orchestrator needs from the workers, as two small handles.

The orchestrator (:mod:`telescope.orchestrator.orchestrator`) is written against
:class:`GenerationService` (generate a completion on inference server ``i``) and
:class:`TrainingService` (a training step, a supervised step, push new weights to
every server, save and load checkpoints). :mod:`telescope.runtime.ray_services`
implements both with Ray actors (trainer ranks, inference servers);
``telescope eval`` implements only generation (:mod:`telescope.runtime.standalone_eval`);
tests implement them with in-process fakes, so the orchestration logic is tested
without Ray or a model.

Faults. A training service raises :class:`TrainerFailure` when a rank died; a
generation service raises :class:`~telescope.orchestrator.rollouts.ServerUnavailable`
when a server cannot serve (the group is re-dispatched). Both are abstract base
classes: an implementation subclasses them and writes the abstract methods; the
optional capabilities are methods with defaults that it overrides when it has them:

- ``GenerationService.is_available(server) -> bool``: whether the server takes work now
  (default: always);
- ``TrainingService.can_restart_trainer`` and ``restart_trainer()`` (async): replace every
  trainer rank by a new one (raising :class:`TrainerFailure` when it cannot); the
  orchestrator then loads the last checkpoint (default: cannot);
- ``fault_metrics() -> dict[str, float]`` (either): counters for the step metrics
  (``infra/server_restarts``; default: none);
- ``probe() -> list[dict]`` (either, async): the watchdog's findings on each server and
  trainer rank (see :mod:`telescope.orchestrator.watchdog`; default: none).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from telescope.api.records import FinishReason, SupervisedExample, TrainingBatch
from telescope.orchestrator.deadlines import OperationTimeout
from telescope.orchestrator.rollouts import Generation, ServerUnavailable

__all__ = [
    "GenerationService",
    "SamplingSettings",
    "ServerPool",
    "ServerUnavailable",
    "TrainerFailure",
    "TrainingService",
    "complete_on",
]


class TrainerFailure(RuntimeError):
    """A trainer rank died (or its actor is gone): the trainer group must restart to go on."""

    def __init__(self, what: str, cause: BaseException | None = None) -> None:
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        super().__init__(f"{what}{detail}")
        self.what = what


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


class TrainingService(ABC):
    """The trainer ranks behind a run, and the weight path from them to the servers."""

    #: Whether :meth:`restart_trainer` can replace the ranks (else a rank's death ends the run).
    can_restart_trainer: ClassVar[bool] = False

    @abstractmethod
    async def wait_ready(self) -> None:
        """Return once every rank is set up and the weight path connected; raise if that failed.

        The orchestrator calls it before any other method; the servers may be generating
        already (see the orchestrator's start-up).
        """

    @abstractmethod
    async def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        """One trainer step on every rank; returns the rank-averaged step metrics."""

    @abstractmethod
    async def supervised_step(self, examples: list[SupervisedExample], learning_rate: float) -> dict[str, float]:
        """One supervised (cross-entropy) step on demonstrations, on every rank (the warm start)."""

    @abstractmethod
    async def push_weights(self, version: int, *, held_servers: Sequence[int] = ()) -> dict[str, float]:
        """Send the trainer's weights to every server as ``version``; returns timings.

        Servers in ``held_servers`` take part in the transfer but keep the weights they
        have (an eval server while its eval runs: one set of weights per eval).
        """

    @abstractmethod
    async def save_checkpoint(self, step: int) -> None:
        """Every trainer rank saves checkpoint ``step`` (atomic; ``latest``; retention)."""

    @abstractmethod
    async def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Every trainer rank restores the checkpoint folder ``path``."""

    async def restart_trainer(self) -> None:
        """Replace every trainer rank by a new one (only where :attr:`can_restart_trainer`)."""
        raise TrainerFailure(f"{type(self).__name__} cannot restart its trainer ranks")

    def fault_metrics(self) -> dict[str, float]:
        """Fault counters for the step's metrics."""
        return {}

    async def probe(self) -> list[dict[str, Any]]:
        """The watchdog's findings on each trainer rank (:mod:`telescope.orchestrator.watchdog`)."""
        return []


class ServerPool(GenerationService):
    """The :class:`GenerationService` over one inference client per server (what a run and ``telescope eval`` use).

    Failures, told apart for the scheduler: a request that gets no answer within the
    client's read timeout (``inference_request_timeout_s``) raises
    :class:`~telescope.orchestrator.deadlines.OperationTimeout` (kind
    ``inference_request``: that rollout is errored and counted); a connection refused
    or dropped, or a server marked unavailable (a supervisor is restarting it, see
    :mod:`telescope.runtime.supervisor`), raises
    :class:`~telescope.orchestrator.rollouts.ServerUnavailable` (the group is
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
