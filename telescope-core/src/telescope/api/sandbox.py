"""The sandbox-provider interface: isolated places to run model-written code.

A provider creates sandboxes with resource limits; a sandbox runs commands with a
timeout, takes and gives files, and is destroyed when done. The API is synchronous
(reward functions run in worker threads); providers backed by remote services use
their SDK's synchronous client. ``telescope_sandbox`` holds the pool and the
providers; this module holds only the contract, which its conformance kit
(``telescope.testing.sandbox``) checks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandbox; ``None`` means the provider's default."""

    cpu: float | None = 1.0
    memory_mb: int | None = 512
    disk_mb: int | None = 512
    timeout_s: float | None = 60.0
    max_processes: int | None = 64
    network: bool = False


@dataclass
class ExecResult:
    """The outcome of one command."""

    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    resource_usage: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class Sandbox(ABC):
    """One isolated environment. Destroy it when done (it is also a context manager)."""

    sandbox_id: str = ""

    @abstractmethod
    def execute(
        self,
        command: str | list[str],
        *,
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run a command inside the sandbox; never raises for a failing command."""

    @abstractmethod
    def upload(self, path: str, data: bytes) -> None:
        """Write a file inside the sandbox (path relative to its working directory)."""

    @abstractmethod
    def download(self, path: str) -> bytes:
        """Read a file from inside the sandbox."""

    @abstractmethod
    def destroy(self) -> None:
        """Stop everything running in the sandbox and free its resources (idempotent)."""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


class SandboxError(RuntimeError):
    """A sandbox could not be created or used (not a failing command)."""


class SandboxProvider(ABC):
    """Creates sandboxes."""

    name: ClassVar[str] = ""

    @abstractmethod
    def create(self, limits: SandboxLimits | None = None) -> Sandbox:
        """Create a sandbox with the given limits (or the provider's defaults)."""

    def close(self) -> None:
        """Release provider-wide resources (clients, pools)."""
