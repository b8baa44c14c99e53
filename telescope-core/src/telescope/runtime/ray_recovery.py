"""Recovery of the run's Ray workers: restarting dead servers and trainer ranks, and the watchdog's probe.

:class:`WorkerRecovery` is the fault-handling half of
:class:`~telescope.runtime.ray_services.RayServices` (which inherits it), kept apart
because it is one concept: what happens after a worker dies.

- :meth:`~WorkerRecovery.supervise` starts the
  :class:`~telescope.runtime.supervisor.ServerSupervisor` (``inference_health_check_interval_s``,
  ``inference_max_restarts``), which restarts a dead server on its placement
  (:meth:`~WorkerRecovery.restart_server`: the same actor, else a new one on the same
  bundle) and gives it the weights the others hold (:meth:`~WorkerRecovery.resync_weights`).
- :meth:`~WorkerRecovery.restart_trainer` replaces every trainer rank on the same bundles,
  removes the run's shared-memory folders the killed rank 0 left, and connects the
  weight transport again; the orchestrator then loads the last checkpoint.
- :meth:`~WorkerRecovery.probe` tells the watchdog which server or rank does not answer.

The state it works on (the actors, the server pool, the weight-push condition and the
last pushed version) belongs to ``RayServices``; the annotations below declare it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import ray

from telescope.inference.generation import ServerPool
from telescope.orchestrator.services import TrainerFailure
from telescope.runtime.worker_deaths import oom_kills
from telescope.transports.shm_folders import remove_run_folders

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from telescope.inference.client import InferenceClient
    from telescope.runtime.supervisor import ServerSupervisor
    from telescope.schema.config import TelescopeConfig

#: Seconds a trainer rank has to answer the watchdog's ping (its monitor thread answers during a step).
PING_TIMEOUT_S = 5.0


class WorkerRecovery:
    """Restarts and probes of the run's workers (see the module docstring)."""

    config: TelescopeConfig
    run_id: str
    servers: list[Any]
    trainers: list[Any]
    generation: ServerPool
    supervisor: ServerSupervisor | None
    trainer_restarts: int
    transport_name: str
    transport_context: Any
    transport_settings: Any
    receivers_per_server: int
    _new_server: Callable[[int], Any] | None
    _new_trainer: Callable[[int], Any] | None
    _weights: asyncio.Condition
    _pushed_version: int | None
    _trainer_ahead: bool
    _init_info: Any
    _oom_kills_at_start: int | None

    if TYPE_CHECKING:  # provided by RayServices

        def _client(self, url: str, index: int) -> InferenceClient: ...

        async def _on_ranks(self, what: str, call: Callable[[Any], Any], ranks: int | None = None) -> list[Any]: ...

        async def _push(self, version: int, also: int | None = None, held: Sequence[int] = ()) -> dict[str, float]: ...

        async def connect_weights(self, servers: Sequence[int] | None = None) -> None: ...

        def _serving(self, also: int | None = None) -> list[int]: ...

    def supervise(self, on_fatal: Callable[[BaseException], None]) -> None:
        """Start restarting dead servers (``inference_health_check_interval_s > 0``); ``on_fatal`` ends the run."""
        from telescope.runtime.supervisor import ServerSupervisor

        c = self.config
        if c.inference_health_check_interval_s <= 0 or not self.servers:
            return
        self.supervisor = ServerSupervisor(
            self, c.inference_health_check_interval_s, c.inference_max_restarts, on_fatal
        ).start()
        self.generation.on_failure = self.supervisor.check_soon

    async def restart_server(self, index: int) -> str:
        """Start server ``index`` again on its placement (the same actor, else a new one); returns its URL."""
        try:
            url = str(await self.servers[index].restart.remote())
        except ray.exceptions.RayActorError:  # the actor died with its server: a new one on the same bundle
            assert self._new_server is not None
            with contextlib.suppress(Exception):
                ray.kill(self.servers[index])
            self.servers[index] = self._new_server(index)
            url = str(await self.servers[index].base_url.remote())
        client = self.generation.clients[index]
        if url.rstrip("/") != client.base_url:  # another port: a new client (the old one is closed)
            self.generation.clients[index] = self._client(url, index)
            with contextlib.suppress(Exception):
                await client.aclose()
        return url

    async def resync_weights(self, index: int) -> None:
        """Give restarted server ``index`` the weights the others hold: connect the transport again, push.

        A new sending end, every server connected to it, and the last pushed version sent
        again (to all: a collective transport sends to the whole group). Waits until the
        trainer holds that version (not between a training step and its push), so the
        weights sent are the ones the version names. Before the first push there is
        nothing to send: the servers only connect.
        """
        async with self._weights:
            await self._weights.wait_for(lambda: not self._trainer_ahead or self._pushed_version is None)
            await self._reconnect(also=index)
            if self._pushed_version is not None:
                await self._push(self._pushed_version, also=index)

    async def _reconnect(self, also: int | None = None) -> None:
        """A new sending end on rank 0 and the servers in service (and ``also``) connected to it."""
        receivers = len(self.generation.clients) * self.receivers_per_server
        [self._init_info] = await self._on_ranks(
            "connecting the weight transport",
            lambda t: t.prepare_sender.remote(
                self.transport_name, self.transport_context, self.transport_settings, receivers
            ),
            ranks=1,
        )
        await self.connect_weights(self._serving(also))

    async def restart_trainer(self) -> None:
        """Replace every trainer rank by a new actor on the same bundle, and connect the weights again.

        The new ranks hold the initial model: the orchestrator loads the last checkpoint
        next, then pushes its weights.
        """
        assert self._new_trainer is not None
        self.trainer_restarts += 1
        for trainer in self.trainers:
            with contextlib.suppress(Exception):
                ray.kill(trainer, no_restart=True)
        remove_run_folders(self.run_id)  # the killed rank 0 did not close its transport
        self._oom_kills_at_start = oom_kills()
        self.trainers[:] = [self._new_trainer(r) for r in range(len(self.trainers))]  # in place: the monitor's list
        try:
            master_addr, master_port = await self.trainers[0].rendezvous_address.remote()
            await asyncio.gather(*(t.setup.remote(master_addr, master_port) for t in self.trainers))
            async with self._weights:
                self._trainer_ahead = True  # the new ranks hold no version the servers have
                await self._reconnect()
        except ray.exceptions.RayActorError as exc:
            raise TrainerFailure("a new trainer rank died while starting", exc) from exc

    def fault_metrics(self) -> dict[str, float]:
        restarts = self.supervisor.total_restarts if self.supervisor is not None else 0
        return {"infra/server_restarts": float(restarts)}

    async def probe(self) -> list[dict[str, Any]]:
        """The watchdog's findings: does each server answer ``/health``, does each trainer rank answer a ping?"""
        from telescope.runtime.supervisor import probe_rank, probe_server

        checks = [probe_server(i, c, self.generation) for i, c in enumerate(self.generation.clients)]
        checks += [probe_rank(r, t, PING_TIMEOUT_S) for r, t in enumerate(self.trainers)]
        return list(await asyncio.gather(*checks))
