"""Inference servers that die are restarted: health checks, restarts on the same placement, weights.

:class:`ServerSupervisor` checks every inference server every
``inference_health_check_interval_s`` (``GET /health``, 5 s timeout). A server is dead
when its process has exited (its :class:`~telescope.runtime.workers.InferenceWorker`
says so, or the actor itself is gone) or when its checks failed for
:data:`UNRESPONSIVE_RESTART_S` in a row (at least :data:`FAILED_CHECKS_TO_RESTART`
checks: it hangs, or is stopped). A request that fails to connect asks for a check at once
(:attr:`~telescope.inference.generation.ServerPool.on_failure`), so a server killed
mid-run is noticed within a second or two. Then, for that server:

1. it is marked unavailable in the :class:`~telescope.inference.generation.ServerPool`:
   the scheduler sends it nothing and re-dispatches the groups it held
   (:mod:`telescope.orchestrator.scheduler`);
2. it is restarted on its placement: the same actor starts a new server process (the
   backend's ``start_server`` with the same index, so the same device and port), or, when
   the actor died too, a new actor takes the same placement-group bundle
   (:meth:`~telescope.runtime.ray_recovery.WorkerRecovery.restart_server`);
3. it gets the current weights: the weight transport is connected again and the last
   pushed version is pushed again (:meth:`~telescope.runtime.ray_recovery.WorkerRecovery.resync_weights`,
   which waits while a training step has moved the trainer past that version);
4. it is marked available again; ``infra/server_restarts`` counts the restart and an
   ``inference.server_restart`` event (``server``, ``reason``, ``url``) times it.

A server that needs more than ``inference_max_restarts`` restarts fails the run
(``on_fatal``), as does a restart that fails. ``inference_health_check_interval_s: 0``
turns all of this off (a dead server then fails its groups until the run stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import ray

from telescope.api import events

if TYPE_CHECKING:
    from telescope.inference.generation import ServerPool

log = logging.getLogger("telescope.run.supervisor")

#: A server whose process still runs is restarted once its health checks failed this many times in a row...
FAILED_CHECKS_TO_RESTART = 3
#: ... over at least this many seconds (a loaded server may answer slowly for a while).
UNRESPONSIVE_RESTART_S = 30.0
#: Seconds a health check (and asking the actor whether the process lives) may take.
CHECK_TIMEOUT_S = 5.0


class SupervisedServers(Protocol):
    """What the supervisor needs of the run's workers (``RayServices``, through its ``WorkerRecovery``).

    Declared here, by its user, so that the supervisor does not import the recovery that
    starts it.
    """

    servers: list[Any]  # the servers' Ray actor handles, by index
    generation: ServerPool

    async def restart_server(self, index: int) -> str:
        """Start server ``index`` again on its placement; returns its new URL."""
        ...

    async def resync_weights(self, index: int) -> None:
        """Give server ``index`` the weights every other server holds."""
        ...


class ServerLost(RuntimeError):
    """An inference server could not be kept running; the message says which and why."""


class ServerSupervisor:
    """Keeps the inference servers of a run alive (see the module docstring)."""

    def __init__(
        self,
        services: SupervisedServers,
        interval_s: float,
        max_restarts: int,
        on_fatal: Callable[[BaseException], None],
    ) -> None:
        self.services = services
        self.interval_s = interval_s
        self.max_restarts = max_restarts
        self.on_fatal = on_fatal
        self.restarts: dict[int, int] = {}
        self.failures: dict[int, int] = {}
        self.failing_since: dict[int, float] = {}
        self.restarting: set[int] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._restart_tasks: set[asyncio.Task[None]] = set()

    @property
    def total_restarts(self) -> int:
        return sum(self.restarts.values())

    def start(self) -> ServerSupervisor:
        self._task = asyncio.create_task(self._loop(), name="server-supervisor")
        return self

    def check_soon(self, server: int) -> None:
        """A request to ``server`` failed: check it now rather than at the next interval."""
        self._wake.set()

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._restart_tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):  # wait_for could lose stop()'s cancellation
                    await self._wake.wait()
            self._wake.clear()
            servers = [i for i in range(len(self.services.servers)) if i not in self.restarting]
            await asyncio.gather(*(self._check(i) for i in servers))

    async def _check(self, index: int) -> None:
        client = self.services.generation.clients[index]
        if await client.health():
            self.failures[index] = 0
            self.failing_since.pop(index, None)
            return
        alive = await self._process_alive(index)
        self.failures[index] = self.failures.get(index, 0) + 1
        since = self.failing_since.setdefault(index, time.monotonic())
        unresponsive = time.monotonic() - since
        if alive and (self.failures[index] < FAILED_CHECKS_TO_RESTART or unresponsive < UNRESPONSIVE_RESTART_S):
            return
        reason = (
            "its process exited"
            if not alive
            else f"it has not answered /health for {unresponsive:.0f} s ({self.failures[index]} checks)"
        )
        self.restarting.add(index)
        task = asyncio.create_task(self._restart(index, reason), name=f"restart-server-{index}")
        self._restart_tasks.add(task)
        task.add_done_callback(self._restart_tasks.discard)

    async def _process_alive(self, index: int) -> bool:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                return bool(await _awaited(self.services.servers[index].alive.remote()))
        except (ray.exceptions.RayActorError, IndexError):
            return False  # the actor is gone, and its server with it
        except Exception:  # the actor does not answer: treat the server as alive but failing
            return True

    async def _restart(self, index: int, reason: str) -> None:
        pool = self.services.generation
        pool.set_unavailable(index, f"restarting ({reason})")
        count = self.restarts[index] = self.restarts.get(index, 0) + 1
        try:
            if count > self.max_restarts:
                raise ServerLost(
                    f"inference server {index} died again ({reason}) after {self.max_restarts} restart(s) "
                    f"(inference_max_restarts: {self.max_restarts}); see logs/inference_{index}.log"
                )
            log.warning("inference server %d: %s; restarting it (restart %d)", index, reason, count)
            with events.timed(
                "inference.server_restart", component="inference", server=index, reason=reason, restart=count
            ) as event:
                event["url"] = await self.services.restart_server(index)
                await self.services.resync_weights(index)
            self.failures[index] = 0
            self.failing_since.pop(index, None)
            pool.set_unavailable(index, None)
            log.warning("inference server %d is back (%s)", index, event["url"])
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.error("inference server %d could not be restarted: %s", index, exc)
            self.on_fatal(
                exc
                if isinstance(exc, ServerLost)
                else ServerLost(
                    f"inference server {index} died ({reason}) and could not be restarted: {type(exc).__name__}: {exc}"
                )
            )
        finally:
            self.restarting.discard(index)


async def _awaited(ref: Any) -> Any:
    return await ref


async def probe_server(index: int, client: Any, pool: ServerPool) -> dict[str, Any]:
    """The watchdog's finding on server ``index``: does it answer ``/health`` (and what the pool knows)?"""
    ok = await client.health()
    where = {"component": "inference_server", "server": index, "url": client.base_url}
    if ok:
        return {**where, "ok": True, "detail": f"inference server {index} answers /health"}
    state = pool.unavailable.get(index)
    detail = f"inference server {index} ({client.base_url}) does not answer /health"
    return {**where, "ok": False, "detail": detail + (f"; it is {state}" if state else "")}


async def probe_rank(index: int, trainer: Any, timeout_s: float) -> dict[str, Any]:
    """The watchdog's finding on trainer rank ``index`` (its actor): does it answer a ping within ``timeout_s``?"""
    where = {"component": "trainer_rank", "rank": index}
    try:
        async with asyncio.timeout(timeout_s):
            info = await _awaited(trainer.ping.remote())
    except TimeoutError:
        detail = f"trainer rank {index} does not answer a ping within {timeout_s:g} s (hung or stopped)"
        return {**where, "ok": False, "detail": detail}
    except Exception as exc:
        detail = f"trainer rank {index} does not answer: {type(exc).__name__}: {exc}"
        return {**where, "ok": False, "detail": detail}
    return {**where, **info, "ok": True, "detail": f"trainer rank {index} answers (pid {info['pid']})"}
