"""A thread-safe pool of pre-warmed sandboxes with bounded concurrency.

Design:

- ``size`` sandboxes are created up front (in parallel), so the first samples do not
  pay the creation latency of a remote provider.
- At most ``max_concurrency`` sandboxes are leased at once (a semaphore);
  :meth:`SandboxPool.acquire` blocks for a free slot, up to ``acquire_timeout_s``.
- A sandbox is never handed to a second sample dirty: on release it is reset
  (working directory emptied, and the local provider's private /tmp and /dev/shm;
  that provider has already killed every process when each command ended) when its
  provider supports ``reset`` and the sandbox
  is not marked dirty (a timeout, disk overrun or launcher failure marks it);
  otherwise it is destroyed and a fresh one is created in its place (when the next
  lease finds no idle sandbox).
- A reset or destroy that fails is contained (the sample that used the sandbox goes
  on) but never silent: it is counted (``reset_failures``, ``destroy_failures``, and
  the lease's ``SandboxUsage.sandbox_errors``), logged as a warning, and recorded as
  the ``error`` of its ``sandbox.reset`` / ``sandbox.destroy`` event; a sandbox whose
  reset failed is destroyed, never reused.
- Every lease can carry a :class:`~telescope_sandbox.observed.SandboxUsage`, so the
  sample that used the sandbox gets its command counts and timings.

Reward functions run in worker threads: every method is safe to call from several
threads. ``close`` destroys every idle sandbox; sandboxes still leased are destroyed
when returned.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from telescope.api.sandbox import SandboxError, SandboxLimits, SandboxProvider
from telescope_sandbox.observed import ObservedProvider, ObservedSandbox, SandboxUsage
from telescope_sandbox.providers import get_provider

logger = logging.getLogger(__name__)


class SandboxPool:
    """Pre-warmed, bounded, never-dirty sandboxes for concurrent reward functions."""

    def __init__(
        self,
        provider: SandboxProvider | str = "local",
        *,
        size: int = 2,
        max_concurrency: int | None = None,
        limits: SandboxLimits | None = None,
        prewarm: bool = True,
        acquire_timeout_s: float | None = 300.0,
        provider_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if size < 0:
            raise ValueError(f"a sandbox pool needs size >= 0, got {size}")
        if isinstance(provider, str):
            self.provider = get_provider(provider, **(provider_kwargs or {}))
        elif isinstance(provider, ObservedProvider):
            self.provider = provider
        else:
            self.provider = ObservedProvider(provider)
        self.size = size
        self.max_concurrency = max_concurrency or max(size, 1)
        self.limits = limits or SandboxLimits()
        self.acquire_timeout_s = acquire_timeout_s
        self._slots = threading.BoundedSemaphore(self.max_concurrency)
        self._lock = threading.Lock()
        self._idle: list[ObservedSandbox] = []
        self._leased = 0
        self._closed = False
        self.created = 0
        self.reused = 0
        self.discarded = 0
        #: Resets and destroys that raised (the sandbox was destroyed, or left, instead).
        self.reset_failures = 0
        self.destroy_failures = 0
        if prewarm and size:
            self.prewarm()

    def _create(self, usage: SandboxUsage | None = None) -> ObservedSandbox:
        sandbox = self.provider.create(self.limits, usage=usage)
        with self._lock:
            self.created += 1
        return sandbox

    def prewarm(self) -> None:
        """Create sandboxes (in parallel) until ``size`` are idle."""
        with self._lock:
            missing = self.size - len(self._idle)
        if missing <= 0:
            return
        with ThreadPoolExecutor(max_workers=min(missing, 8)) as executor:
            fresh = list(executor.map(lambda _: self._create(), range(missing)))
        with self._lock:
            self._idle.extend(fresh)

    @property
    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    @property
    def leased(self) -> int:
        with self._lock:
            return self._leased

    @contextmanager
    def acquire(self, usage: SandboxUsage | None = None) -> Iterator[ObservedSandbox]:
        """Lease a clean sandbox for one sample: ``with pool.acquire(usage) as sb: ...``."""
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
        if not self._slots.acquire(timeout=self.acquire_timeout_s):
            raise SandboxError(
                f"no sandbox became free within {self.acquire_timeout_s} s "
                f"(max_concurrency={self.max_concurrency}); raise it or the timeout"
            )
        sandbox: ObservedSandbox | None = None
        try:
            with self._lock:
                sandbox = self._idle.pop() if self._idle else None
                self._leased += 1
            if sandbox is None:
                sandbox = self._create(usage)
            sandbox.usage = usage
            yield sandbox
        finally:
            try:
                if sandbox is not None:
                    sandbox.usage = None
                    self._release(sandbox, usage)
            finally:
                with self._lock:
                    self._leased -= 1
                self._slots.release()

    def _release(self, sandbox: ObservedSandbox, usage: SandboxUsage | None = None) -> None:
        keep = False
        if not self._closed and not sandbox.dirty:
            try:
                sandbox.reset()
                keep = not sandbox.dirty
            except Exception as exc:
                self._count_failure("reset", sandbox, exc, usage)
        if keep:
            with self._lock:
                if not self._closed and len(self._idle) < max(self.size, 1):
                    self._idle.append(sandbox)
                    self.reused += 1
                    return
        with self._lock:
            self.discarded += 1
        self._destroy(sandbox, usage)

    def _destroy(self, sandbox: ObservedSandbox, usage: SandboxUsage | None = None) -> None:
        """Destroy ``sandbox``; one that will not die must not take the sample down with it."""
        try:
            sandbox.destroy()
        except Exception as exc:
            self._count_failure("destroy", sandbox, exc, usage)

    def _count_failure(self, what: str, sandbox: ObservedSandbox, exc: Exception, usage: SandboxUsage | None) -> None:
        with self._lock:
            if what == "reset":
                self.reset_failures += 1
            else:
                self.destroy_failures += 1
        if usage is not None:
            usage.record_error()
        then = "it is destroyed instead of reused" if what == "reset" else "what it holds may be left behind"
        logger.warning("sandbox %s (%s): %s failed (%s); %s", sandbox.sandbox_id, sandbox.provider, what, exc, then)

    def close(self) -> None:
        """Destroy every idle sandbox; leased ones are destroyed when they come back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sandbox in idle:
            self._destroy(sandbox)
        self.provider.close()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
