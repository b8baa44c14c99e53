"""The ``modal`` provider (``pip install 'telescope-sandbox[modal]'``), on ``modal.Sandbox``.

Creation: ``modal.Sandbox.create(app=App.lookup(app_name, create_if_missing=True),
image, timeout, cpu, memory, block_network)`` - modal enforces CPU, memory and the
lifetime; there is no per-sandbox disk limit in its API. Commands:
``sandbox.exec("sh", "-c", cmd, timeout, workdir, env)``, then ``wait()``,
``returncode`` and the ``stdout``/``stderr`` streams. Files travel through
commands (``cat`` with stdin, ``base64``), which needs only the public exec API.
Needs modal credentials (``modal token new``).
"""

from __future__ import annotations

import base64
import shlex
from typing import Any

from telescope.api.sandbox import SandboxError, SandboxLimits, SandboxProvider
from telescope_sandbox.providers import missing_sdk
from telescope_sandbox.remote.base import TIMEOUT_EXIT_CODE, RemoteSandbox


class ModalSandbox(RemoteSandbox):
    workdir = "/root/telescope"

    def __init__(self, sandbox: Any, limits: SandboxLimits) -> None:
        super().__init__(str(sandbox.object_id), limits)
        self._sandbox = sandbox
        self._sandbox.exec("mkdir", "-p", self.workdir).wait()

    def _raw_execute(
        self, command: str, timeout: float | None, env: dict[str, str], cwd: str
    ) -> tuple[int, str, str, bool]:
        process = self._sandbox.exec(
            "sh", "-c", command, timeout=int(timeout) if timeout else None, workdir=cwd, env=dict(env) or None
        )
        code = process.wait()
        stdout, stderr = process.stdout.read(), process.stderr.read()
        code = process.returncode if code is None else code
        timed_out = code == -1 or (code is None)  # modal reports a killed-at-timeout exec as -1
        if timed_out:
            return TIMEOUT_EXIT_CODE, stdout, stderr, True
        return int(code), stdout, stderr, False

    def _raw_upload(self, path: str, data: bytes) -> None:
        directory = path.rsplit("/", 1)[0] or "/"
        cmd = f"mkdir -p {shlex.quote(directory)} && base64 -d > {shlex.quote(path)}"
        process = self._sandbox.exec("sh", "-c", cmd)
        process.stdin.write(base64.b64encode(data))
        process.stdin.write_eof()
        process.stdin.drain()
        if process.wait() != 0:
            raise SandboxError(f"upload of {path!r} to sandbox {self.sandbox_id} failed: {process.stderr.read()}")

    def _raw_download(self, path: str) -> bytes:
        process = self._sandbox.exec("base64", path)
        if process.wait() != 0:
            raise SandboxError(f"no file {path!r} in sandbox {self.sandbox_id}")
        return base64.b64decode(process.stdout.read())

    def _raw_destroy(self) -> None:
        self._sandbox.terminate()


class ModalProvider(SandboxProvider):
    """Sandboxes on Modal."""

    name = "modal"

    def __init__(self, app_name: str = "telescope-sandboxes", image: Any = None, sdk: Any = None) -> None:
        if sdk is None:
            try:
                import modal as sdk
            except ImportError as exc:
                raise missing_sdk("modal", "modal", exc) from exc
        self._sdk = sdk
        self.app_name = app_name
        self._image = image
        self._app: Any = None

    def create(self, limits: SandboxLimits | None = None) -> ModalSandbox:
        limits = limits or SandboxLimits()
        if self._app is None:
            self._app = self._sdk.App.lookup(self.app_name, create_if_missing=True)
        image = self._image if self._image is not None else self._sdk.Image.debian_slim()
        sandbox = self._sdk.Sandbox.create(
            app=self._app,
            image=image,
            timeout=int((limits.timeout_s or 300) + 300),
            cpu=limits.cpu,
            memory=limits.memory_mb,
            block_network=not limits.network,
        )
        return ModalSandbox(sandbox, limits)
