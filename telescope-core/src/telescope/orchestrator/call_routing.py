"""Which server an episode's request goes to: its group's (affinity, the default) or the least busy.

A group is dispatched to one training server (:mod:`telescope.orchestrator.scheduler`): its
lanes are taken there. With ``episode_server_affinity`` (the default) every request of its
episodes, every turn and every agent call, goes to that server, so an episode's later
requests find their shared prefix in that server's prefix cache (the embedded engine's
:mod:`~telescope.inference.embedded.prefix_cache`, vLLM's automatic prefix caching).
Without it each request goes to the available training server with the fewest of this
run's requests in flight (the group's own on a tie): load spreads per request, and a
prefix is reused only where the request happens to land.

Either way a request whose server cannot serve raises
:class:`~telescope.inference.generation.ServerUnavailable` and the group runs again (the
scheduler's re-dispatch).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class CallRouter:
    """Counts each server's requests in flight and picks a request's server (see the module docstring)."""

    def __init__(self, servers: list[int], available: Callable[[int], bool], affinity: bool = True) -> None:
        self.servers = list(servers)
        self.available = available
        self.affinity = affinity
        self.in_flight = dict.fromkeys(self.servers, 0)

    def choose(self, home: int) -> int:
        """The server of a request of an episode dispatched to ``home``."""
        if self.affinity:
            return home
        candidates = [s for s in self.servers if self.available(s)] or [home]
        return min(candidates, key=lambda s: (self.in_flight.get(s, 0), s != home))

    async def call(self, home: int, request: Callable[[int], Awaitable[T]]) -> T:
        """``request(server)`` on the chosen server, counted in flight while it runs."""
        server = self.choose(home)
        self.in_flight[server] = self.in_flight.get(server, 0) + 1
        try:
            return await request(server)
        finally:
            self.in_flight[server] -= 1
