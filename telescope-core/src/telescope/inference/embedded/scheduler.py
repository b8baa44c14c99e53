"""The embedded engine's waiting queue: first-come-first-served or by priority.

``fcfs``: requests are admitted in arrival order. ``priority`` (vLLM's
``--scheduling-policy priority``): the lowest ``priority`` value first, ties in
arrival order. The orchestrator gives later turns of a multi-turn rollout a
lower value, so a conversation that is already under way finishes before new
ones start (less head-of-line blocking).

Admission is strict: when the request at the head does not fit in the free
slots (it needs ``n`` sequences), nothing behind it jumps the queue. Unlike
vLLM, running sequences are never preempted to make room for a more urgent one;
the queue order only decides who gets the next free slot.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Generic, Literal, TypeVar

T = TypeVar("T")
SchedulingPolicy = Literal["fcfs", "priority"]


class WaitingQueue(Generic[T]):
    """A heap keyed by ``(priority or 0, arrival)``; items are removed lazily."""

    def __init__(self, policy: SchedulingPolicy = "fcfs") -> None:
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"unknown scheduling policy {policy!r}; use 'fcfs' or 'priority'")
        self.policy = policy
        self._heap: list[tuple[int, int, T]] = []
        self._arrival = itertools.count()
        self._removed: set[int] = set()
        self._ids: dict[int, int] = {}

    def push(self, item: T, priority: int = 0) -> None:
        key = priority if self.policy == "priority" else 0
        arrival = next(self._arrival)
        self._ids[id(item)] = arrival
        heapq.heappush(self._heap, (key, arrival, item))

    def _clean(self) -> None:
        while self._heap and self._heap[0][1] in self._removed:
            self._removed.discard(heapq.heappop(self._heap)[1])

    def peek(self) -> T | None:
        self._clean()
        return self._heap[0][2] if self._heap else None

    def pop(self) -> T:
        self._clean()
        _, _, item = heapq.heappop(self._heap)
        self._ids.pop(id(item), None)
        return item

    def remove(self, item: T) -> bool:
        arrival = self._ids.pop(id(item), None)
        if arrival is None:
            return False
        self._removed.add(arrival)
        return True

    def __len__(self) -> int:
        return len(self._heap) - len(self._removed)

    def __iter__(self) -> Iterator[T]:
        return (item for _, arrival, item in sorted(self._heap) if arrival not in self._removed)
