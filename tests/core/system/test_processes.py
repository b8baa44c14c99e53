"""A server process dies with the process that started it (so no one kills it by PID from another host)."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import cast

import pytest

from telescope.api.inference import InferenceServer, ServerAddress
from telescope.system.processes import PortInUseError, ProcessServer, listens_on, spawn, start_on_free_port

PARENT = """
import sys, time
from pathlib import Path
from telescope.system.processes import spawn
child = spawn([sys.executable, "-c", "import time; time.sleep(120)"], {}, Path(sys.argv[1]))
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_spawned_server_dies_when_its_parent_is_killed(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "child.log")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)  # what a crashed or ray.kill-ed actor gets
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        parent.kill()


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def test_a_health_answer_from_another_process_on_the_port_does_not_count(tmp_path: Path) -> None:
    """Another run's server on the port answers /health: only our process listening on it counts."""
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    port = other.server_address[1]
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        assert listens_on(os.getpid(), port)
        quiet = spawn([sys.executable, "-c", "import time; time.sleep(60)"], {}, tmp_path / "quiet.log")
        server = ProcessServer(quiet, ServerAddress("127.0.0.1", port), tmp_path / "quiet.log", bind_host="127.0.0.1")
        with pytest.raises(TimeoutError):
            server.wait_until_healthy(timeout=2)
        assert not listens_on(quiet.pid, port)
        clashed = spawn([sys.executable, "-c", "raise SystemExit(1)"], {}, tmp_path / "clash.log")
        server = ProcessServer(clashed, ServerAddress("127.0.0.1", port), tmp_path / "clash.log", bind_host="127.0.0.1")
        with pytest.raises(PortInUseError):  # it exited and the port is held by someone else
            server.wait_until_healthy(timeout=30)
    finally:
        other.shutdown()
        other.server_close()


def test_a_server_that_lost_its_port_starts_again_on_another() -> None:
    tried: list[int] = []

    def start(port: int) -> InferenceServer:
        tried.append(port)
        if len(tried) == 1:
            raise PortInUseError("taken meanwhile")
        return cast(InferenceServer, object())

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        held = int(holder.getsockname()[1])
        start_on_free_port(start, "127.0.0.1", held)
    assert len(tried) == 2 and held not in tried and tried[0] != tried[1]
