"""Security cases for the local provider: each is contained, with a clear result, host unharmed.

The strongest guarantees (private uid: host files, exact process limit) need the
tests to run as root; without root those cases check the weaker documented behaviour.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from telescope.api.sandbox import SandboxLimits
from telescope_sandbox.local import LocalProvider, LocalSandbox

ROOT = os.geteuid() == 0


@pytest.fixture
def sandbox() -> Iterator[LocalSandbox]:
    sb = LocalProvider().create(SandboxLimits(memory_mb=256, disk_mb=16, timeout_s=20, max_processes=32))
    yield sb
    sb.destroy()


def _pids_matching(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


@pytest.mark.exclusive  # asserts the kill comes within seconds of the timeout: on free cores
def test_infinite_loop_is_killed_at_the_timeout(sandbox: LocalSandbox) -> None:
    t0 = time.monotonic()
    result = sandbox.execute(["python3", "-c", "while True: pass"], timeout_s=1.0)
    assert result.timed_out and not result.ok and "timed out" in result.stderr
    assert time.monotonic() - t0 < 5
    assert sandbox.execute("echo still usable").stdout.strip() == "still usable"


@pytest.mark.slow
@pytest.mark.exclusive  # asserts the bomb is stopped within seconds: on free cores
def test_fork_bomb_is_contained(sandbox: LocalSandbox) -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    result = sandbox.execute(["python3", "-c", bomb], timeout_s=3.0)
    assert not result.ok
    assert time.monotonic() - t0 < 20
    assert result.resource_usage["leftover_processes"] >= 1  # the bomb's children were found and killed
    if ROOT:
        assert sandbox.uid is not None
        left = subprocess.run(["pgrep", "-u", str(sandbox.uid)], capture_output=True, text=True).stdout
        assert left.strip() == ""
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


def test_ten_times_the_memory_limit_fails_cleanly(sandbox: LocalSandbox) -> None:
    result = sandbox.execute(["python3", "-c", "b = bytearray(10 * 256 * 1024 * 1024); print('got it')"])
    assert result.exit_code != 0 and "got it" not in result.stdout
    assert "MemoryError" in result.stderr


def test_file_larger_than_disk_limit_is_refused(sandbox: LocalSandbox) -> None:
    code = "f = open('big', 'wb')\nfor _ in range(64): f.write(b'x' * 1048576)\nf.close()\nprint('done')"
    result = sandbox.execute(["python3", "-c", code])
    assert result.exit_code != 0 and "done" not in result.stdout
    # the file stopped at the limit
    assert os.path.getsize(os.path.join(sandbox.workdir, "big")) <= 16 * 1024 * 1024


def test_many_small_files_past_the_disk_limit_fail_the_command(sandbox: LocalSandbox) -> None:
    code = "for i in range(24):\n    open(f'f{i}', 'wb').write(b'x' * 1048576)\nprint('done')"
    result = sandbox.execute(["python3", "-c", code])
    assert result.exit_code != 0 and "disk limit exceeded" in result.stderr
    assert sandbox.dirty


@pytest.mark.skipif(not ROOT, reason="host-file protection needs a private uid (root host)")
def test_host_private_files_are_unreadable(sandbox: LocalSandbox, tmp_path: os.PathLike[str]) -> None:
    secret = os.path.join(str(tmp_path), "secret.txt")
    with open(secret, "w") as f:
        f.write("TOP SECRET")
    os.chmod(secret, 0o600)
    result = sandbox.execute(["cat", secret])
    assert result.exit_code != 0 and "TOP SECRET" not in result.stdout
    result = sandbox.execute(["sh", "-c", "cat /root/.bashrc /proc/1/environ 2>&1; ls /root"])
    assert "Permission denied" in result.stdout or result.exit_code != 0
    # and symlinks out of the sandbox are not followed by download
    sandbox.execute(["ln", "-s", secret, "link.txt"])
    with pytest.raises(Exception, match="outside the sandbox"):
        sandbox.download("link.txt")


def test_download_refuses_paths_outside(sandbox: LocalSandbox) -> None:
    with pytest.raises(Exception, match="outside the sandbox"):
        sandbox.download("../../etc/passwd")
    with pytest.raises(Exception, match="outside the sandbox"):
        sandbox.upload("/etc/telescope-should-not-exist", b"x")
    assert not os.path.exists("/etc/telescope-should-not-exist")


def test_host_environment_is_not_leaked(sandbox: LocalSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELESCOPE_FAKE_API_KEY", "sk-should-not-leak")
    result = sandbox.execute("env")
    assert "sk-should-not-leak" not in result.stdout


def test_network_connection_fails(sandbox: LocalSandbox) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\nprint('connected')"
    result = sandbox.execute(["python3", "-c", code])
    server.settimeout(0.2)  # a connection that got through would be waiting in the backlog
    try:
        server.accept()
        accepted = True
    except OSError:
        accepted = False
    server.close()
    if not sandbox.network_isolated:
        pytest.skip("this kernel does not allow network namespaces: the local provider has the host network here")
    assert result.exit_code != 0 and "connected" not in result.stdout and not accepted
    outside = sandbox.execute(["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)"])
    assert outside.exit_code != 0 and "unreachable" in outside.stderr.lower()


def test_background_processes_do_not_outlive_the_command(sandbox: LocalSandbox) -> None:
    marker = f"telescope_bg_{os.getpid()}"
    script = (
        f"(exec -a {marker}_a sleep 300 &)\n"
        f"setsid sh -c 'exec -a {marker}_b sleep 300' &\n"
        f"nohup python3 -c 'import os,time\nif os.fork()==0:\n    os.setsid(); time.sleep(300)' &\n"
        "echo launched"
    )
    result = sandbox.execute(["bash", "-c", script])
    assert result.stdout.strip() == "launched"
    assert result.resource_usage["leftover_processes"] >= 2
    time.sleep(0.2)
    assert _pids_matching(marker) == []
    if ROOT:
        assert subprocess.run(["pgrep", "-u", str(sandbox.uid)], capture_output=True).returncode == 1


def test_output_flood_is_truncated(sandbox: LocalSandbox) -> None:
    result = sandbox.execute(["python3", "-c", "import sys\nfor _ in range(300): sys.stdout.write('y' * 10000)"])
    assert result.exit_code == 0
    assert len(result.stdout) < 1_100_000 and "more bytes of output dropped" in result.stdout


def test_destroy_removes_the_directory(sandbox: LocalSandbox) -> None:
    root = os.path.dirname(sandbox.workdir)
    sandbox.upload("a.txt", b"x")
    sandbox.destroy()
    assert not os.path.exists(root)
