"""Remote providers against their SDKs' real classes, with no network.

Calls go to ``create_autospec`` mocks of the SDK classes, so a call that does not
match the SDK's real signature fails; request models (pydantic) are the SDK's own.
The prime provider (test_remote_prime.py) also runs the whole conformance kit, over a stand-in client
that executes its commands in a local sandbox. No test reaches a live service.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from unittest.mock import MagicMock, create_autospec

import pytest

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
def test_daytona_create_execute_files() -> None:
    daytona = pytest.importorskip("daytona")
    from telescope_sandbox.remote.daytona import DaytonaProvider

    client = create_autospec(daytona.Daytona, instance=True)
    remote = MagicMock()
    remote.id = "d-1"
    client.create.return_value = remote
    remote.process.exec.return_value = daytona.ExecuteResponse(exit_code=3, result="out")
    sandbox = DaytonaProvider(client=client).create(LIMITS)
    params = client.create.call_args.args[0]
    assert isinstance(params, daytona.CreateSandboxFromImageParams)
    assert (params.resources.cpu, params.resources.memory, params.resources.disk) == (2, 2, 2)
    assert params.network_block_all is True
    result = sandbox.execute("false", timeout_s=2.5)
    assert result.exit_code == 3 and result.stdout == "out"
    remote.process.exec.assert_called_with("false", cwd="/home/daytona/telescope", env=None, timeout=3)
    remote.fs.download_file.return_value = b"data"
    assert sandbox.download("f.txt") == b"data"
    remote.fs.download_file.assert_called_with("/home/daytona/telescope/f.txt")
    remote.process.exec.side_effect = daytona.DaytonaTimeoutError("too slow")
    assert sandbox.execute("sleep 9").timed_out
    sandbox.destroy()
    client.delete.assert_called_once_with(remote)


# ------------------------------------------------------------------------------ e2b
def test_e2b_create_execute_files() -> None:
    e2b = pytest.importorskip("e2b")
    from telescope_sandbox.remote.e2b import E2BProvider

    remote = MagicMock()
    remote.sandbox_id = "e-1"
    remote.commands.run.return_value = SimpleNamespace(exit_code=0, stdout="ok", stderr="")
    sdk = SimpleNamespace(
        Sandbox=create_autospec(e2b.Sandbox),
        CommandExitException=e2b.CommandExitException,
        TimeoutException=e2b.TimeoutException,
        NotFoundException=e2b.NotFoundException,
    )
    sdk.Sandbox.create.return_value = remote
    sandbox = E2BProvider(template="python", sdk=sdk).create(LIMITS)
    kwargs = sdk.Sandbox.create.call_args.kwargs
    assert kwargs["template"] == "python" and kwargs["allow_internet_access"] is False and kwargs["timeout"] == 330
    assert sandbox.execute("echo ok", env={"A": "1"}).stdout == "ok"
    remote.commands.run.assert_called_with("echo ok", timeout=30, envs={"A": "1"}, cwd="/home/user/telescope")
    remote.commands.run.side_effect = e2b.TimeoutException("slow")
    assert sandbox.execute("sleep 99").timed_out
    remote.files.read.side_effect = e2b.NotFoundException("gone")
    with pytest.raises(SandboxError):
        sandbox.download("missing")
    sandbox.destroy()
    remote.kill.assert_called_once_with()


# ---------------------------------------------------------------------------- modal
def test_modal_create_execute() -> None:
    modal = pytest.importorskip("modal")
    from telescope_sandbox.remote.modal import ModalProvider

    remote = MagicMock()
    remote.object_id = "sb-m"
    process = MagicMock()
    process.wait.return_value = 0
    process.stdout.read.return_value = "hello"
    process.stderr.read.return_value = ""
    remote.exec.return_value = process
    sdk = SimpleNamespace(
        App=create_autospec(modal.App), Image=create_autospec(modal.Image), Sandbox=create_autospec(modal.Sandbox)
    )
    sdk.Sandbox.create.return_value = remote
    sandbox = ModalProvider(sdk=sdk).create(LIMITS)
    kwargs = sdk.Sandbox.create.call_args.kwargs
    assert kwargs["cpu"] == 2 and kwargs["memory"] == 1536 and kwargs["block_network"] is True
    sdk.App.lookup.assert_called_once_with("telescope-sandboxes", create_if_missing=True)
    result = sandbox.execute(["echo", "hello"], timeout_s=4)
    assert result.ok and result.stdout == "hello"
    remote.exec.assert_called_with("sh", "-c", "echo hello", timeout=4, workdir="/root/telescope", env=None)
    process.wait.return_value = -1
    assert sandbox.execute("sleep 10", timeout_s=1).timed_out
    sandbox.destroy()
    remote.terminate.assert_called_once_with()
