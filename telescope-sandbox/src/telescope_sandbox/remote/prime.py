"""The ``prime`` provider (``pip install 'telescope-sandbox[prime]'``), on ``prime-sandboxes``.

Creation: ``SandboxClient(APIClient(api_key)).create(CreateSandboxRequest(name,
docker_image, cpu_cores, memory_gb, disk_size_gb, timeout_minutes))`` then
``wait_for_creation`` - Prime enforces CPU, memory, disk and lifetime. Commands:
``execute_command(sandbox_id, cmd, working_dir, env, timeout)`` ->
``CommandResponse(stdout, stderr, exit_code)``; a time-out raises
``CommandTimeoutError``. Files: ``upload_bytes`` and ``download_file`` (through a
local temporary file). Destroy: ``delete(sandbox_id)``. Needs ``PRIME_API_KEY`` or
``api_key`` (or ``prime config set-api-key``).
"""

from __future__ import annotations

import math
import os
import posixpath
import tempfile
import uuid
from typing import Any

from telescope.api.sandbox import SandboxError, SandboxLimits, SandboxProvider
from telescope_sandbox.providers import missing_sdk
from telescope_sandbox.remote.base import TIMEOUT_EXIT_CODE, RemoteSandbox


class PrimeSandbox(RemoteSandbox):
    workdir = "/workspace"

    def __init__(self, sdk: Any, client: Any, sandbox_id: str, limits: SandboxLimits) -> None:
        super().__init__(sandbox_id, limits)
        self._sdk = sdk
        self._client = client
        self._client.execute_command(self.sandbox_id, f"mkdir -p {self.workdir}")

    def _raw_execute(
        self, command: str, timeout: float | None, env: dict[str, str], cwd: str
    ) -> tuple[int, str, str, bool]:
        try:
            response = self._client.execute_command(
                self.sandbox_id,
                command,
                working_dir=cwd,
                env=env or None,
                timeout=math.ceil(timeout) if timeout else None,
            )
        except self._sdk.CommandTimeoutError as exc:
            return TIMEOUT_EXIT_CODE, "", str(exc), True
        return int(response.exit_code), str(response.stdout or ""), str(response.stderr or ""), False

    def _raw_upload(self, path: str, data: bytes) -> None:
        self._client.upload_bytes(self.sandbox_id, path, data, posixpath.basename(path))

    def _raw_download(self, path: str) -> bytes:
        fd, local = tempfile.mkstemp(prefix="telescope-prime-")
        os.close(fd)
        try:
            self._client.download_file(self.sandbox_id, path, local)
            with open(local, "rb") as f:
                return f.read()
        except self._sdk.SandboxFileNotFoundError as exc:
            raise SandboxError(f"no file {path!r} in sandbox {self.sandbox_id}") from exc
        finally:
            os.unlink(local)

    def _raw_destroy(self) -> None:
        self._client.delete(self.sandbox_id)


class PrimeProvider(SandboxProvider):
    """Sandboxes on Prime Intellect."""

    name = "prime"

    def __init__(
        self, docker_image: str = "python:3.11-slim", api_key: str | None = None, client: Any = None, sdk: Any = None
    ) -> None:
        if sdk is None:
            try:
                import prime_sandboxes

                sdk = prime_sandboxes
            except ImportError as exc:
                raise missing_sdk("prime", "prime_sandboxes", exc) from exc
        self._sdk = sdk
        self.docker_image = docker_image
        self._client = client if client is not None else sdk.SandboxClient(sdk.APIClient(api_key=api_key))

    def create(self, limits: SandboxLimits | None = None) -> PrimeSandbox:
        limits = limits or SandboxLimits()
        request = self._sdk.CreateSandboxRequest(
            name=f"telescope-{uuid.uuid4().hex[:10]}",
            docker_image=self.docker_image,
            cpu_cores=max(1, math.ceil(limits.cpu or 1)),
            memory_gb=max(1, math.ceil((limits.memory_mb or 1024) / 1024)),
            disk_size_gb=max(1, math.ceil((limits.disk_mb or 1024) / 1024)),
            timeout_minutes=max(1, math.ceil(((limits.timeout_s or 300) + 300) / 60)),
        )
        sandbox = self._client.create(request)
        self._client.wait_for_creation(sandbox.id)
        return PrimeSandbox(self._sdk, self._client, str(sandbox.id), limits)
