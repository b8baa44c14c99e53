"""What the remote providers share: command rendering, path handling, timing, idempotent destroy."""

from __future__ import annotations

import posixpath
import shlex
import time
from abc import abstractmethod

from telescope.api.sandbox import ExecResult, Sandbox, SandboxError, SandboxLimits

#: Exit code reported for a command the service stopped at its timeout (as ``timeout(1)`` does).
TIMEOUT_EXIT_CODE = 124


def render_command(command: str | list[str]) -> str:
    """A shell command line: strings pass through, argv lists are quoted."""
    return command if isinstance(command, str) else shlex.join(command)


class RemoteSandbox(Sandbox):
    """A sandbox on a service; subclasses implement the ``_raw_*`` calls with their SDK."""

    #: The working directory inside the remote sandbox; relative paths are resolved against it.
    workdir: str = "/tmp/telescope"

    def __init__(self, sandbox_id: str, limits: SandboxLimits) -> None:
        self.sandbox_id = sandbox_id
        self.limits = limits
        self._destroyed = False

    def path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    def _check(self) -> None:
        if self._destroyed:
            raise SandboxError(f"sandbox {self.sandbox_id} has been destroyed")

    def execute(
        self,
        command: str | list[str],
        *,
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        self._check()
        timeout = timeout_s if timeout_s is not None else self.limits.timeout_s
        t0 = time.perf_counter()
        exit_code, stdout, stderr, timed_out = self._raw_execute(
            render_command(command), timeout, env or {}, self.path(cwd) if cwd else self.workdir
        )
        return ExecResult(exit_code, stdout, stderr, time.perf_counter() - t0, timed_out=timed_out)

    def upload(self, path: str, data: bytes) -> None:
        self._check()
        self._raw_upload(self.path(path), data)

    def download(self, path: str) -> bytes:
        self._check()
        return self._raw_download(self.path(path))

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self._raw_destroy()

    @abstractmethod
    def _raw_execute(
        self, command: str, timeout: float | None, env: dict[str, str], cwd: str
    ) -> tuple[int, str, str, bool]:
        """Run ``command`` in ``cwd``; return (exit code, stdout, stderr, timed out)."""

    @abstractmethod
    def _raw_upload(self, path: str, data: bytes) -> None: ...

    @abstractmethod
    def _raw_download(self, path: str) -> bytes: ...

    @abstractmethod
    def _raw_destroy(self) -> None: ...
