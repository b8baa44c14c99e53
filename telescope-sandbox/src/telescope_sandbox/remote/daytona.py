"""The ``daytona`` provider (``pip install 'telescope-sandbox[daytona]'``), on the Daytona SDK.

Creation: ``Daytona(DaytonaConfig(api_key=...)).create(CreateSandboxFromImageParams(
image, resources=Resources(cpu, memory, disk), network_block_all, ephemeral=True))``
- Daytona enforces CPU (cores), memory and disk (GiB, rounded up). Commands:
``sandbox.process.exec(cmd, cwd, env, timeout)`` -> ``ExecuteResponse(exit_code,
result)`` (stdout and stderr come combined in ``result``); a time-out raises
``DaytonaTimeoutError``. Files: ``sandbox.fs.upload_file(bytes, path)`` /
``download_file(path)``. Destroy: ``Daytona.delete(sandbox)``. Needs
``DAYTONA_API_KEY`` or ``api_key``.
"""

from __future__ import annotations

import math
from typing import Any

from telescope.api.sandbox import SandboxError, SandboxLimits, SandboxProvider
from telescope_sandbox.providers import missing_sdk
from telescope_sandbox.remote.base import TIMEOUT_EXIT_CODE, RemoteSandbox


class DaytonaSandbox(RemoteSandbox):
    workdir = "/home/daytona/telescope"

    def __init__(self, sdk: Any, client: Any, sandbox: Any, limits: SandboxLimits) -> None:
        super().__init__(str(sandbox.id), limits)
        self._sdk = sdk
        self._client = client
        self._sandbox = sandbox
        self._sandbox.process.exec(f"mkdir -p {self.workdir}")

    def _raw_execute(
        self, command: str, timeout: float | None, env: dict[str, str], cwd: str
    ) -> tuple[int, str, str, bool]:
        try:
            response = self._sandbox.process.exec(
                command, cwd=cwd, env=env or None, timeout=math.ceil(timeout) if timeout else None
            )
        except self._sdk.DaytonaTimeoutError as exc:
            return TIMEOUT_EXIT_CODE, "", str(exc), True
        return int(response.exit_code), str(response.result or ""), "", False

    def _raw_upload(self, path: str, data: bytes) -> None:
        self._sandbox.fs.upload_file(data, path)

    def _raw_download(self, path: str) -> bytes:
        try:
            data = self._sandbox.fs.download_file(path)
        except self._sdk.DaytonaError as exc:
            raise SandboxError(f"cannot read {path!r} in sandbox {self.sandbox_id}: {exc}") from exc
        if data is None:
            raise SandboxError(f"no file {path!r} in sandbox {self.sandbox_id}")
        return bytes(data)

    def _raw_destroy(self) -> None:
        self._client.delete(self._sandbox)


class DaytonaProvider(SandboxProvider):
    """Sandboxes on Daytona."""

    name = "daytona"

    def __init__(
        self, image: str = "python:3.11-slim", api_key: str | None = None, client: Any = None, sdk: Any = None
    ) -> None:
        if sdk is None:
            try:
                import daytona

                sdk = daytona
            except ImportError as exc:
                raise missing_sdk("daytona", "daytona", exc) from exc
        self._sdk = sdk
        self.image = image
        self._client = client if client is not None else sdk.Daytona(sdk.DaytonaConfig(api_key=api_key))

    def create(self, limits: SandboxLimits | None = None) -> DaytonaSandbox:
        limits = limits or SandboxLimits()
        resources = self._sdk.Resources(
            cpu=math.ceil(limits.cpu) if limits.cpu else None,
            memory=math.ceil(limits.memory_mb / 1024) if limits.memory_mb else None,
            disk=math.ceil(limits.disk_mb / 1024) if limits.disk_mb else None,
        )
        params = self._sdk.CreateSandboxFromImageParams(
            image=self.image, resources=resources, network_block_all=not limits.network, ephemeral=True
        )
        sandbox = self._client.create(params, timeout=max(60.0, float(limits.timeout_s or 60)))
        return DaytonaSandbox(self._sdk, self._client, sandbox, limits)
