"""Conformance kit for sandbox providers: inherit, give a provider factory, run pytest.

Usage, in the provider package's own tests::

    from telescope.testing.sandbox import SandboxProviderConformance

    class TestMyProvider(SandboxProviderConformance):
        def provider_factory(self):
            return MyProvider(api_key=...)

Every inherited ``test_*`` method checks one part of the contract of
:mod:`telescope.api.sandbox`: create, execute (exit codes, stdout/stderr, env, cwd),
timeouts, upload/download round trips (binary-safe, nested paths), idempotent
destroy, isolation between two sandboxes, and the memory and file-size limits.
Override ``limits`` to change the limits the kit creates sandboxes with, and set
``enforces_limits = False`` for a provider whose limits are set by the service and
cannot be checked from inside (then the limit tests are skipped, not failed).

The commands use POSIX ``sh`` and ``python3``, which every provider image is
expected to have. The kit is synchronous and needs pytest only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import pytest

from telescope.api.sandbox import ExecResult, Sandbox, SandboxError, SandboxLimits, SandboxProvider


class SandboxProviderConformance:
    """Base class of a provider's conformance tests (pytest collects the subclass)."""

    #: Limits the kit's sandboxes are created with.
    limits: ClassVar[SandboxLimits] = SandboxLimits(cpu=1, memory_mb=256, disk_mb=64, timeout_s=30)
    #: False for providers whose memory/file limits cannot be checked from inside.
    enforces_limits: ClassVar[bool] = True
    #: Seconds a command is given in the timeout test.
    short_timeout_s: ClassVar[float] = 1.0

    def provider_factory(self) -> SandboxProvider:
        raise NotImplementedError("a conformance test class must define provider_factory()")

    @pytest.fixture
    def provider(self) -> Iterator[SandboxProvider]:
        provider = self.provider_factory()
        yield provider
        provider.close()

    @pytest.fixture
    def sandbox(self, provider: SandboxProvider) -> Iterator[Sandbox]:
        sandbox = provider.create(self.limits)
        yield sandbox
        sandbox.destroy()

    # ------------------------------------------------------------------ basics
    def test_provider_has_name(self, provider: SandboxProvider) -> None:
        assert isinstance(type(provider).name, str) and type(provider).name

    def test_create_gives_an_id(self, sandbox: Sandbox) -> None:
        assert isinstance(sandbox.sandbox_id, str) and sandbox.sandbox_id

    def test_execute_success(self, sandbox: Sandbox) -> None:
        result = sandbox.execute("echo hello")
        assert isinstance(result, ExecResult)
        assert result.exit_code == 0 and result.ok and not result.timed_out
        assert result.stdout.strip() == "hello"
        assert result.duration_s >= 0.0

    def test_execute_failure_is_a_result_not_an_exception(self, sandbox: Sandbox) -> None:
        result = sandbox.execute("echo oops >&2; exit 3")
        assert result.exit_code == 3 and not result.ok
        assert "oops" in result.stderr

    def test_execute_argv_list(self, sandbox: Sandbox) -> None:
        result = sandbox.execute(["python3", "-c", "import sys; print(sys.argv[1:])", "a b", "c"])
        assert result.exit_code == 0, result.stderr
        assert result.stdout.strip() == "['a b', 'c']"

    def test_execute_env(self, sandbox: Sandbox) -> None:
        result = sandbox.execute("echo $TELESCOPE_KIT_VAR", env={"TELESCOPE_KIT_VAR": "v42"})
        assert result.stdout.strip() == "v42"

    def test_execute_cwd(self, sandbox: Sandbox) -> None:
        sandbox.upload("sub/marker.txt", b"x")
        result = sandbox.execute("ls", cwd="sub")
        assert "marker.txt" in result.stdout.split()

    def test_timeout(self, sandbox: Sandbox) -> None:
        result = sandbox.execute("sleep 30", timeout_s=self.short_timeout_s)
        assert result.timed_out and not result.ok
        assert result.duration_s < 20

    # ------------------------------------------------------------------- files
    def test_upload_download_roundtrip(self, sandbox: Sandbox) -> None:
        payload = bytes(range(256)) * 4
        sandbox.upload("data/blob.bin", payload)
        assert sandbox.download("data/blob.bin") == payload

    def test_uploaded_file_visible_to_commands(self, sandbox: Sandbox) -> None:
        sandbox.upload("main.py", b"print(6 * 7)\n")
        result = sandbox.execute("python3 main.py")
        assert result.stdout.strip() == "42", result.stderr

    def test_command_output_file_downloadable(self, sandbox: Sandbox) -> None:
        sandbox.execute("printf 'made inside' > out.txt")
        assert sandbox.download("out.txt") == b"made inside"

    def test_download_missing_file_raises(self, sandbox: Sandbox) -> None:
        with pytest.raises((SandboxError, FileNotFoundError)):
            sandbox.download("no/such/file.txt")

    # --------------------------------------------------------------- lifecycle
    def test_destroy_is_idempotent(self, provider: SandboxProvider) -> None:
        sandbox = provider.create(self.limits)
        sandbox.destroy()
        sandbox.destroy()

    def test_context_manager_destroys(self, provider: SandboxProvider) -> None:
        with provider.create(self.limits) as sandbox:
            assert sandbox.execute("true").exit_code == 0
        with pytest.raises(SandboxError):
            sandbox.execute("true")

    def test_isolation_between_sandboxes(self, provider: SandboxProvider) -> None:
        a = provider.create(self.limits)
        b = provider.create(self.limits)
        try:
            assert a.sandbox_id != b.sandbox_id
            a.upload("secret.txt", b"only in a")
            assert b.execute("cat secret.txt").exit_code != 0
            with pytest.raises((SandboxError, FileNotFoundError)):
                b.download("secret.txt")
        finally:
            a.destroy()
            b.destroy()

    # ------------------------------------------------------------------ limits
    def test_memory_limit(self, sandbox: Sandbox) -> None:
        if not self.enforces_limits or not self.limits.memory_mb:
            pytest.skip("this provider's memory limit is not checked by the kit")
        size = self.limits.memory_mb * 4 * 1024 * 1024
        result = sandbox.execute(["python3", "-c", f"b = bytearray({size}); print('allocated')"])
        assert result.exit_code != 0 and "allocated" not in result.stdout

    def test_file_size_limit(self, sandbox: Sandbox) -> None:
        if not self.enforces_limits or not self.limits.disk_mb:
            pytest.skip("this provider's disk limit is not checked by the kit")
        size_mb = self.limits.disk_mb * 2
        code = (
            f"f = open('big.bin', 'wb')\nfor _ in range({size_mb}): f.write(b'0' * 1048576)\n"
            "f.close()\nprint('written')"
        )
        result = sandbox.execute(["python3", "-c", code])
        assert result.exit_code != 0 and "written" not in result.stdout
