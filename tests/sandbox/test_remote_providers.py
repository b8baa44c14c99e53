"""Remote providers against their SDKs' real classes, with no network.

Every SDK object the providers call is a :func:`sdk_fakes.sdk_fake` of the SDK's own
class (the client, the sandbox, its ``commands``/``files``/``process``/``fs``, modal's
process and streams), so a call that does not match the installed SDK's signature raises
TypeError; results, request models and exceptions are the SDK's own classes. Each SDK's
tests skip when it is not installed. The prime provider (test_remote_prime.py) also runs
the whole conformance kit. No test reaches a live service.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest
from sdk_fakes import sdk_fake

from telescope.api.sandbox import SandboxError, SandboxLimits, SandboxProvider
from telescope.plugins.manager import get_plugin_manager
from telescope.plugins.registry import PluginKind
from telescope_sandbox import get_provider

LIMITS = SandboxLimits(cpu=2, memory_mb=1536, disk_mb=2048, timeout_s=30)


@pytest.mark.parametrize("name", ["e2b", "modal", "daytona", "prime"])
def test_registered_lazily(name: str) -> None:
    entry = get_plugin_manager().registry.entry(PluginKind.SANDBOX_PROVIDER, name)
    assert entry.is_lazy and entry.distribution == "telescope-sandbox"
    assert issubclass(entry.load(), SandboxProvider)


@pytest.mark.parametrize(
    ("name", "module"), [("e2b", "e2b"), ("modal", "modal"), ("daytona", "daytona"), ("prime", "prime_sandboxes")]
)
def test_missing_sdk_says_how_to_install(name: str, module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(SandboxError, match=rf"pip install 'telescope-sandbox\[{name}\]'"):
        get_provider(name)


# -------------------------------------------------------------------------- daytona
def daytona_fakes(daytona: Any) -> tuple[Any, Any]:
    """A fake Daytona client whose create() returns a fake Sandbox (with fake process and fs)."""
    remote = sdk_fake(daytona.Sandbox, id="d-1")
    client = sdk_fake(daytona.Daytona)
    client.create.return_value = remote
    remote.process.exec.return_value = daytona.ExecuteResponse(exit_code=0, result="")
    return client, remote


def test_daytona_create_execute_files() -> None:
    daytona = pytest.importorskip("daytona")
    from telescope_sandbox.remote.daytona import DaytonaProvider

    client, remote = daytona_fakes(daytona)
    sandbox = DaytonaProvider(client=client, sdk=daytona).create(LIMITS)
    params = client.create.call_args.args[0]
    assert isinstance(params, daytona.CreateSandboxFromImageParams)
    assert (params.resources.cpu, params.resources.memory, params.resources.disk) == (2, 2, 2)
    assert params.network_block_all is True
    remote.process.exec.return_value = daytona.ExecuteResponse(exit_code=3, result="out")
    result = sandbox.execute("false", timeout_s=2.5)
    assert result.exit_code == 3 and result.stdout == "out"
    remote.process.exec.assert_called_with("false", cwd="/home/daytona/telescope", env=None, timeout=3)
    sandbox.upload("a/b.py", b"x")
    remote.fs.upload_file.assert_called_once_with(b"x", "/home/daytona/telescope/a/b.py")
    remote.fs.download_file.return_value = b"data"
    assert sandbox.download("f.txt") == b"data"
    remote.fs.download_file.assert_called_with("/home/daytona/telescope/f.txt")
    remote.process.exec.side_effect = daytona.DaytonaTimeoutError("too slow")
    assert sandbox.execute("sleep 9").timed_out
    sandbox.destroy()
    client.delete.assert_called_once_with(remote)


# ------------------------------------------------------------------------------ e2b
def e2b_fakes(e2b: Any) -> tuple[Any, Any]:
    """The SDK namespace the provider uses, with a fake Sandbox class whose create() returns a fake instance."""
    remote = sdk_fake(e2b.Sandbox, sandbox_id="e-1")
    remote.commands.run.return_value = e2b.CommandResult(stderr="", stdout="ok", exit_code=0, error=None)
    sdk = SimpleNamespace(
        Sandbox=sdk_fake(e2b.Sandbox, instance=False),
        CommandExitException=e2b.CommandExitException,
        TimeoutException=e2b.TimeoutException,
        NotFoundException=e2b.NotFoundException,
    )
    sdk.Sandbox.create.return_value = remote
    return sdk, remote


def test_e2b_create_execute_files() -> None:
    e2b = pytest.importorskip("e2b")
    from telescope_sandbox.remote.e2b import E2BProvider

    sdk, remote = e2b_fakes(e2b)
    sandbox = E2BProvider(template="python", api_key="k", sdk=sdk).create(LIMITS)
    sdk.Sandbox.create.assert_called_once_with(template="python", timeout=330, allow_internet_access=False, api_key="k")
    remote.commands.run.assert_called_once_with("mkdir -p /home/user/telescope", timeout=60)
    assert sandbox.execute("echo ok", env={"A": "1"}).stdout == "ok"
    remote.commands.run.assert_called_with("echo ok", timeout=30, envs={"A": "1"}, cwd="/home/user/telescope")
    remote.commands.run.side_effect = e2b.CommandExitException(stderr="bad", stdout="", exit_code=2, error="exit 2")
    failed = sandbox.execute("false")
    assert (failed.exit_code, failed.stderr, failed.timed_out) == (2, "bad", False)
    remote.commands.run.side_effect = e2b.TimeoutException("slow")
    assert sandbox.execute("sleep 99").timed_out
    sandbox.upload("x.txt", b"data")
    remote.files.write.assert_called_once_with("/home/user/telescope/x.txt", b"data")
    remote.files.read.return_value = bytearray(b"data")
    assert sandbox.download("x.txt") == b"data"
    remote.files.read.assert_called_with("/home/user/telescope/x.txt", format="bytes")
    remote.files.read.side_effect = e2b.NotFoundException("gone")
    with pytest.raises(SandboxError):
        sandbox.download("missing")
    sandbox.destroy()
    remote.kill.assert_called_once_with()


# ---------------------------------------------------------------------------- modal
def modal_fakes(modal: Any) -> tuple[Any, Any, Any]:
    """The SDK namespace (fake App, Image and Sandbox classes), the fake sandbox and its fake exec process."""
    from modal.container_process import ContainerProcess

    process = sdk_fake(ContainerProcess, returncode=0)
    process.wait.return_value = 0
    process.stdout.read.return_value = "hello"
    process.stderr.read.return_value = ""
    remote = sdk_fake(modal.Sandbox, object_id="sb-m")
    remote.exec.return_value = process
    sdk = SimpleNamespace(
        App=sdk_fake(modal.App, instance=False),
        Image=sdk_fake(modal.Image, instance=False),
        Sandbox=sdk_fake(modal.Sandbox, instance=False),
    )
    sdk.Sandbox.create.return_value = remote
    return sdk, remote, process


def test_modal_create_execute_files() -> None:
    modal = pytest.importorskip("modal")
    from telescope_sandbox.remote.modal import ModalProvider

    sdk, remote, process = modal_fakes(modal)
    sandbox = ModalProvider(sdk=sdk).create(LIMITS)
    kwargs = sdk.Sandbox.create.call_args.kwargs
    assert kwargs["cpu"] == 2 and kwargs["memory"] == 1536 and kwargs["block_network"] is True
    assert kwargs["timeout"] == 330 and kwargs["app"] is sdk.App.lookup.return_value
    sdk.App.lookup.assert_called_once_with("telescope-sandboxes", create_if_missing=True)
    result = sandbox.execute(["echo", "hello"], timeout_s=4, env={"A": "1"})
    assert result.ok and result.stdout == "hello"
    remote.exec.assert_called_with("sh", "-c", "echo hello", timeout=4, workdir="/root/telescope", env={"A": "1"})
    sandbox.upload("a.txt", b"hi")
    process.stdin.write.assert_called_once_with(b"aGk=")
    process.stdin.write_eof.assert_called_once_with()
    process.stdout.read.return_value = "aGk="
    assert sandbox.download("a.txt") == b"hi"
    remote.exec.assert_called_with("base64", "/root/telescope/a.txt")
    process.wait.return_value = -1
    assert sandbox.execute("sleep 10", timeout_s=1).timed_out
    sandbox.destroy()
    remote.terminate.assert_called_once_with()


# ------------------------------------------------------- the fakes reject wrong calls


def _wrong_calls() -> list[Any]:
    """(SDK module, call that the SDK's signature rejects) pairs; each SDK's case skips without it."""

    def e2b_run_with_env(e2b: Any) -> None:
        e2b_fakes(e2b)[1].commands.run("ls", env={"A": "1"})  # the SDK's keyword is envs

    def e2b_create_with_unknown_option(e2b: Any) -> None:
        e2b_fakes(e2b)[0].Sandbox.create(template="t", internet=False)  # not a parameter nor an ApiParams key

    def modal_exec_with_cwd(modal: Any) -> None:
        modal_fakes(modal)[1].exec("sh", "-c", "ls", cwd="/")  # the SDK's keyword is workdir

    def modal_create_with_memory_mb(modal: Any) -> None:
        modal_fakes(modal)[0].Sandbox.create(memory_mb=512)

    def modal_read_with_argument(modal: Any) -> None:
        modal_fakes(modal)[2].stdout.read(10)

    def daytona_exec_with_workdir(daytona: Any) -> None:
        daytona_fakes(daytona)[1].process.exec("ls", workdir="/")

    return [
        pytest.param("e2b", e2b_run_with_env, id="e2b-run-env"),
        pytest.param("e2b", e2b_create_with_unknown_option, id="e2b-create-unknown"),
        pytest.param("modal", modal_exec_with_cwd, id="modal-exec-cwd"),
        pytest.param("modal", modal_create_with_memory_mb, id="modal-create-memory_mb"),
        pytest.param("modal", modal_read_with_argument, id="modal-stdout-read-arg"),
        pytest.param("daytona", daytona_exec_with_workdir, id="daytona-exec-workdir"),
    ]


@pytest.mark.parametrize(("module", "call"), _wrong_calls())
def test_fakes_reject_what_the_sdk_rejects(module: str, call: Any) -> None:
    with pytest.raises(TypeError):
        call(pytest.importorskip(module))


def test_fake_attributes_must_exist_in_the_sdk() -> None:
    e2b = pytest.importorskip("e2b")
    with pytest.raises(AttributeError, match="sandbox_identifier"):
        sdk_fake(e2b.Sandbox, sandbox_identifier="e-1")
