"""The ``e2b`` provider (``pip install 'telescope-sandbox[e2b]'``), on the e2b SDK's sync ``Sandbox``.

Creation: ``Sandbox.create(template, timeout, allow_internet_access, envs)``; the
sandbox lives for ``timeout_s`` plus a margin (e2b's sandbox timeout is its
lifetime). Commands: ``sandbox.commands.run(cmd, timeout, envs, cwd)``; a
non-zero exit raises ``CommandExitException`` (turned back into a result) and a
time-out ``TimeoutException``. Files: ``sandbox.files.write`` / ``read(format="bytes")``.
CPU and memory are properties of the e2b template, not of a call: choose a
template with the limits you need (``template=``). Needs ``E2B_API_KEY`` or ``api_key``.
"""

from __future__ import annotations

from typing import Any

from telescope.api.sandbox import SandboxError, SandboxLimits, SandboxProvider
from telescope_sandbox.providers import missing_sdk
from telescope_sandbox.remote.base import TIMEOUT_EXIT_CODE, RemoteSandbox


class E2BSandbox(RemoteSandbox):
    workdir = "/home/user/telescope"

    def __init__(self, sdk: Any, sandbox: Any, limits: SandboxLimits) -> None:
        super().__init__(str(sandbox.sandbox_id), limits)
        self._sdk = sdk
        self._sandbox = sandbox
        self._sandbox.commands.run(f"mkdir -p {self.workdir}", timeout=60)

    def _raw_execute(
        self, command: str, timeout: float | None, env: dict[str, str], cwd: str
    ) -> tuple[int, str, str, bool]:
        try:
            result = self._sandbox.commands.run(command, timeout=timeout or 0, envs=env or None, cwd=cwd)
        except self._sdk.CommandExitException as exc:
            return int(exc.exit_code), str(exc.stdout), str(exc.stderr), False
        except self._sdk.TimeoutException as exc:
            return TIMEOUT_EXIT_CODE, "", str(exc), True
        return int(result.exit_code), str(result.stdout), str(result.stderr), False

    def _raw_upload(self, path: str, data: bytes) -> None:
        self._sandbox.files.write(path, data)

    def _raw_download(self, path: str) -> bytes:
        try:
            return bytes(self._sandbox.files.read(path, format="bytes"))
        except self._sdk.NotFoundException as exc:
            raise SandboxError(f"no file {path!r} in sandbox {self.sandbox_id}") from exc

    def _raw_destroy(self) -> None:
        self._sandbox.kill()


class E2BProvider(SandboxProvider):
    """Sandboxes on e2b.dev."""

    name = "e2b"

    def __init__(self, template: str | None = None, api_key: str | None = None, sdk: Any = None) -> None:
        if sdk is None:
            try:
                import e2b as sdk
            except ImportError as exc:
                raise missing_sdk("e2b", "e2b", exc) from exc
        self._sdk = sdk
        self.template = template
        self.api_key = api_key

    def create(self, limits: SandboxLimits | None = None) -> E2BSandbox:
        limits = limits or SandboxLimits()
        opts: dict[str, Any] = {"api_key": self.api_key} if self.api_key else {}
        lifetime = int((limits.timeout_s or 300) + 300)
        sandbox = self._sdk.Sandbox.create(
            template=self.template, timeout=lifetime, allow_internet_access=limits.network, **opts
        )
        return E2BSandbox(self._sdk, sandbox, limits)
