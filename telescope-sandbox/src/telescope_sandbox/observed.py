"""Sandbox observability: every creation, command, transfer and teardown is a timed event.

:class:`ObservedProvider` and :class:`ObservedSandbox` wrap any provider and any
sandbox (local or remote), so observability does not depend on each provider
remembering to emit. They emit through :mod:`telescope.api.events`, which the run
store subscribes to:

===================  =====================================================================
kind                 fields (besides ``start`` and ``duration_s``)
===================  =====================================================================
``sandbox.create``   ``provider``, ``sandbox_id``, the limits; ``error`` when it failed
``sandbox.execute``  ``provider``, ``sandbox_id``, ``command`` (first 200 characters),
                     ``exit_code``, ``timed_out``, ``resource_usage`` (CPU s, peak RSS MB,
                     disk MB, leftover processes, as the provider reports them),
                     ``stdout`` and ``stderr`` excerpts (head and tail, 1,000 characters)
``sandbox.upload``   ``provider``, ``sandbox_id``, ``path``, ``bytes``
``sandbox.download`` ``provider``, ``sandbox_id``, ``path``, ``bytes``
``sandbox.reset``    ``provider``, ``sandbox_id``
``sandbox.destroy``  ``provider``, ``sandbox_id``
===================  =====================================================================

Every event has ``component: "sandbox"``; one that failed has ``error``. Emitted inside
a rollout (a reward function or a tool call) they also carry its ``group_id``,
``sample_id``, ``rollout_index`` and ``turn`` (the event context). The run writes
them, readable, to ``logs/sandboxes.log`` as well (:mod:`telescope.recording.run_logs`).

A :class:`SandboxUsage` attached to a sandbox (per sample, by the pool's ``acquire``)
counts the same things, so an environment can put them in its sample metrics
(:meth:`SandboxUsage.as_metrics`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from telescope.api.events import timed
from telescope.api.sandbox import ExecResult, Sandbox, SandboxLimits, SandboxProvider

_COMMAND_CHARS = 200
_OUTPUT_CHARS = 1000


@dataclass
class SandboxUsage:
    """Per-sample counters of sandbox work (thread-safe)."""

    creates: int = 0
    commands: int = 0
    command_errors: int = 0
    timeouts: int = 0
    sandbox_errors: int = 0
    command_time_s: float = 0.0
    create_time_s: float = 0.0
    cpu_time_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record_command(self, result: ExecResult) -> None:
        with self._lock:
            self.commands += 1
            self.command_time_s += result.duration_s
            self.cpu_time_s += float(result.resource_usage.get("cpu_s", 0.0))
            if result.timed_out:
                self.timeouts += 1
            elif result.exit_code != 0:
                self.command_errors += 1

    def record_error(self) -> None:
        with self._lock:
            self.sandbox_errors += 1

    def record_create(self, seconds: float) -> None:
        with self._lock:
            self.creates += 1
            self.create_time_s += seconds

    def as_metrics(self, prefix: str = "sandbox_") -> dict[str, float]:
        with self._lock:
            return {
                f"{prefix}commands": float(self.commands),
                f"{prefix}command_errors": float(self.command_errors),
                f"{prefix}timeouts": float(self.timeouts),
                f"{prefix}errors": float(self.sandbox_errors),
                f"{prefix}command_time_s": self.command_time_s,
                f"{prefix}cpu_time_s": self.cpu_time_s,
            }


def _command_text(command: str | list[str]) -> str:
    text = command if isinstance(command, str) else " ".join(command)
    return text if len(text) <= _COMMAND_CHARS else text[:_COMMAND_CHARS] + "..."


def output_excerpt(text: str, limit: int = _OUTPUT_CHARS) -> str:
    """``text`` itself, or its first and last ``limit / 2`` characters with the number left out between."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters ...]\n{text[-half:]}"


class ObservedSandbox(Sandbox):
    """Wraps a sandbox: same behaviour, plus events and optional usage counting."""

    def __init__(self, inner: Sandbox, provider: str, usage: SandboxUsage | None = None) -> None:
        self.inner = inner
        self.provider = provider
        self.sandbox_id = inner.sandbox_id
        self.usage = usage

    def _fields(self) -> dict[str, Any]:
        return {"component": "sandbox", "provider": self.provider, "sandbox_id": self.sandbox_id}

    def execute(
        self,
        command: str | list[str],
        *,
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        try:
            with timed("sandbox.execute", command=_command_text(command), **self._fields()) as event:
                result = self.inner.execute(command, timeout_s=timeout_s, env=env, cwd=cwd)
                event["exit_code"] = result.exit_code
                event["timed_out"] = result.timed_out
                event["resource_usage"] = dict(result.resource_usage)
                event["stdout"] = output_excerpt(result.stdout)
                event["stderr"] = output_excerpt(result.stderr)
        except Exception:
            if self.usage is not None:
                self.usage.record_error()
            raise
        if self.usage is not None:
            self.usage.record_command(result)
        return result

    def upload(self, path: str, data: bytes) -> None:
        with timed("sandbox.upload", path=path, bytes=len(data), **self._fields()):
            self.inner.upload(path, data)

    def download(self, path: str) -> bytes:
        with timed("sandbox.download", path=path, **self._fields()) as event:
            data = self.inner.download(path)
            event["bytes"] = len(data)
        return data

    def reset(self) -> None:
        """Clean the sandbox for reuse, when the provider supports it (else raise)."""
        reset = getattr(self.inner, "reset", None)
        if reset is None:
            raise NotImplementedError(f"provider {self.provider!r} sandboxes cannot be reset")
        with timed("sandbox.reset", **self._fields()):
            reset()

    @property
    def dirty(self) -> bool:
        """Whether the provider marked the sandbox unfit for reuse (timeouts, over disk)."""
        return bool(getattr(self.inner, "dirty", False))

    def destroy(self) -> None:
        with timed("sandbox.destroy", **self._fields()):
            self.inner.destroy()


class ObservedProvider(SandboxProvider):
    """Wraps a provider: every ``create`` is a ``sandbox.create`` event; sandboxes come observed."""

    def __init__(self, inner: SandboxProvider, name: str | None = None) -> None:
        self.inner = inner
        self.provider_name = name or inner.name or type(inner).__name__

    def create(self, limits: SandboxLimits | None = None, usage: SandboxUsage | None = None) -> ObservedSandbox:
        limits = limits or SandboxLimits()
        t0 = time.perf_counter()
        try:
            with timed(
                "sandbox.create",
                component="sandbox",
                provider=self.provider_name,
                cpu=limits.cpu,
                memory_mb=limits.memory_mb,
                disk_mb=limits.disk_mb,
                timeout_s=limits.timeout_s,
            ) as event:
                sandbox = self.inner.create(limits)
                event["sandbox_id"] = sandbox.sandbox_id
        except Exception:
            if usage is not None:
                usage.record_error()
            raise
        if usage is not None:
            usage.record_create(time.perf_counter() - t0)
        return ObservedSandbox(sandbox, self.provider_name, usage)

    def close(self) -> None:
        self.inner.close()
