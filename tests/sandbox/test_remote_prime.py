"""The prime provider against its SDK's real classes, with no network (skipped without the SDK).

Calls go to an :func:`sdk_fakes.sdk_fake` of ``prime_sandboxes.SandboxClient`` (a call that
does not match the installed SDK's signature raises TypeError); the provider also runs
the whole conformance kit over a stand-in client that executes commands in a local
sandbox, whose methods take the SDK's parameters (checked below). Kept apart from the
other providers so that a missing ``prime_sandboxes`` skips only these tests.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from sdk_fakes import assert_same_parameters, sdk_fake

from telescope.api.sandbox import SandboxError, SandboxLimits, SandboxProvider
from telescope.testing.sandbox import SandboxProviderConformance
from telescope_sandbox.local import LocalSandbox

LIMITS = SandboxLimits(cpu=2, memory_mb=1536, disk_mb=2048, timeout_s=30)

# --------------------------------------------------------------------------- prime
prime_sdk = pytest.importorskip("prime_sandboxes")


def test_prime_create_execute_destroy() -> None:
    from telescope_sandbox.remote.prime import PrimeProvider

    client = sdk_fake(prime_sdk.SandboxClient)
    client.create.return_value = prime_sdk.Sandbox.model_construct(id="sb-1")
    client.execute_command.return_value = prime_sdk.CommandResponse(stdout="hi\n", stderr="", exit_code=0)
    sandbox = PrimeProvider(client=client).create(LIMITS)
    request = client.create.call_args.args[0]
    assert isinstance(request, prime_sdk.CreateSandboxRequest)
    assert (request.cpu_cores, request.memory_gb, request.disk_size_gb) == (2, 2, 2)
    client.wait_for_creation.assert_called_once_with("sb-1")
    result = sandbox.execute(["echo", "a b"], timeout_s=5, cwd="sub")
    assert result.ok and result.stdout == "hi\n"
    client.execute_command.assert_called_with("sb-1", "echo 'a b'", working_dir="/workspace/sub", env=None, timeout=5)
    client.execute_command.side_effect = prime_sdk.CommandTimeoutError("sb-1", "sleep", 1)
    timed = sandbox.execute("sleep 9", timeout_s=1)
    assert timed.timed_out and timed.exit_code == 124
    sandbox.upload("a/b.py", b"x")
    client.upload_bytes.assert_called_once_with("sb-1", "/workspace/a/b.py", b"x", "b.py")
    client.download_file.side_effect = prime_sdk.SandboxFileNotFoundError("no such file")
    with pytest.raises(SandboxError, match="no file"):
        sandbox.download("missing.txt")
    assert client.download_file.call_args.args[:2] == ("sb-1", "/workspace/missing.txt")
    sandbox.destroy()
    sandbox.destroy()
    client.delete.assert_called_once_with("sb-1")


class _LocalBackedPrimeClient:
    """Implements the SandboxClient methods the provider uses, running commands locally."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, LocalSandbox] = {}

    def _local(self, sandbox_id: str) -> LocalSandbox:
        if sandbox_id not in self.sandboxes:
            raise prime_sdk.SandboxNotRunningError(sandbox_id)
        return self.sandboxes[sandbox_id]

    def _rel(self, path: str) -> str:
        return os.path.relpath(path, "/workspace")

    def create(self, request: Any) -> Any:
        assert isinstance(request, prime_sdk.CreateSandboxRequest)
        sb = LocalSandbox(SandboxLimits(memory_mb=request.memory_gb * 256, disk_mb=64))
        self.sandboxes[sb.sandbox_id] = sb
        return prime_sdk.Sandbox.model_construct(id=sb.sandbox_id)

    def wait_for_creation(self, sandbox_id: str) -> None:
        self._local(sandbox_id)

    def execute_command(
        self,
        sandbox_id: str,
        command: str,
        working_dir: str | None = None,
        env: dict[str, str] | None = None,
        timeout: int | None = None,
    ) -> Any:
        if command.startswith("mkdir -p /workspace"):
            return prime_sdk.CommandResponse(stdout="", stderr="", exit_code=0)
        cwd = self._rel(working_dir) if working_dir and working_dir != "/workspace" else None
        r = self._local(sandbox_id).execute(command, timeout_s=timeout, env=env, cwd=cwd)
        if r.timed_out:
            raise prime_sdk.CommandTimeoutError(sandbox_id, command, timeout or 0)
        return prime_sdk.CommandResponse(stdout=r.stdout, stderr=r.stderr, exit_code=r.exit_code)

    def upload_bytes(self, sandbox_id: str, file_path: str, file_bytes: bytes, filename: str) -> Any:
        self._local(sandbox_id).upload(self._rel(file_path), file_bytes)

    def download_file(self, sandbox_id: str, file_path: str, local_file_path: str) -> None:
        try:
            data = self._local(sandbox_id).download(self._rel(file_path))
        except SandboxError as exc:
            raise prime_sdk.SandboxFileNotFoundError(sandbox_id, file_path) from exc
        with open(local_file_path, "wb") as f:
            f.write(data)

    def delete(self, sandbox_id: str) -> dict[str, Any]:
        self.sandboxes.pop(sandbox_id).destroy()
        return {}


@pytest.mark.parametrize(
    "method", ["create", "wait_for_creation", "execute_command", "upload_bytes", "download_file", "delete"]
)
def test_stand_in_client_takes_the_sdks_parameters(method: str) -> None:
    assert_same_parameters(getattr(_LocalBackedPrimeClient, method), getattr(prime_sdk.SandboxClient, method))


def test_prime_fake_rejects_a_wrong_keyword() -> None:
    with pytest.raises(TypeError):
        sdk_fake(prime_sdk.SandboxClient).execute_command("sb-1", "ls", cwd="/workspace")  # the SDK's is working_dir


class TestPrimeProviderConformance(SandboxProviderConformance):
    enforces_limits = False  # limits belong to the service; the stand-in does not model them

    def provider_factory(self) -> SandboxProvider:
        from telescope_sandbox.remote.prime import PrimeProvider

        return PrimeProvider(client=_LocalBackedPrimeClient())
