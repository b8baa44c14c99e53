"""A server running as a child process: start it, wait until ``/health`` answers, stop it.

Shared by the embedded and vLLM backends. The child's stdout and stderr go to a
log file (``<run_dir>/logs/inference_<i>.log``, or a temporary file), whose
tail is quoted when the process dies before it is healthy. Health polling is
bounded by a deadline and fails at once if the process exits.

Where it listens and how it is reached: :func:`start_on_free_port` keeps the
configured port unless something (another run's server) holds it, and starts the
server again on another port when it lost a race for it; the health check counts only
an answer from the server's own process (:func:`listens_on`), never from another
run's server on that port. :func:`connect_host` is the address clients dial, the
node's own address for a wildcard bind (:mod:`telescope.system.addressing`), never
an assumed loopback.

How it ends: whoever started it stops it (:meth:`ProcessServer.stop`, which the
inference worker's ``stop`` calls); and on Linux the child gets ``SIGKILL`` when
the thread that started it dies (``PR_SET_PDEATHSIG``): a Ray actor killed or
crashed takes its server with it, on whichever node it ran. Nothing is killed by
PID from another host.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from telescope.api.inference import InferenceServer, ServerAddress
from telescope.system.addressing import advertised_host, bound_socket, is_wildcard

log = logging.getLogger("telescope.run.servers")


def connect_host(bind_host: str) -> str:
    """The address clients dial for a server bound to ``bind_host`` here (the node's address for a wildcard)."""
    return advertised_host(bind_host)


class PortInUseError(RuntimeError):
    """The server process exited before it was healthy because another process holds its port."""


def _bind(bind_host: str, port: int) -> int | None:
    """The port a test bind of ``port`` on ``bind_host`` got (``port`` 0: any), or None when taken."""
    try:
        with bound_socket("" if is_wildcard(bind_host) else bind_host, port) as probe:
            return int(probe.getsockname()[1])
    except OSError:
        return None


def choose_port(bind_host: str, preferred: int) -> int:
    """``preferred`` when it can be bound on ``bind_host`` now, else a free port (logged; 0: any free port)."""
    chosen = (_bind(bind_host, preferred) if preferred else None) or _bind(bind_host, 0)
    if chosen is None:
        raise OSError(f"no free port to bind on {bind_host!r}")
    if preferred and chosen != preferred:
        log.warning("port %d on %s is taken; the inference server listens on %d", preferred, bind_host, chosen)
    return chosen


def start_on_free_port(
    start: Callable[[int], InferenceServer], bind_host: str, preferred: int, attempts: int = 5
) -> InferenceServer:
    """``start(port)`` on ``preferred`` (or a free port when it is taken); again on another port after a clash.

    A port free when chosen can be taken before the server binds it (another run
    starting a server at the same moment): the server then exits with
    :class:`PortInUseError` and starts again elsewhere. So two runs on one machine with
    the same ``inference_base_port`` both start.
    """
    port = choose_port(bind_host, preferred)
    for attempt in range(attempts):
        try:
            return start(port)
        except PortInUseError:
            if attempt == attempts - 1:
                raise
            taken, port = port, choose_port(bind_host, 0)
            log.warning("port %d was taken as the inference server started; trying port %d", taken, port)
    raise AssertionError("unreachable")


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` or one of its descendants listens on TCP ``port`` (this machine's view)."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return False
    for process in processes:
        try:
            connections = process.net_connections(kind="inet")
        except psutil.Error:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in connections):
            return True
    return False


def log_path(run_dir: Path | None, worker_index: int, kind: str, *, console: bool = False) -> Path:
    """Where inference server ``worker_index`` writes: ``logs/inference_<i>.log``, or with
    ``console`` its raw console ``logs/stdout/inference_<i>.log`` (a temporary file without
    a run directory)."""
    if run_dir is not None:
        folder = Path(run_dir) / "logs" / ("stdout" if console else "")
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"inference_{worker_index}.log"
    handle, name = tempfile.mkstemp(prefix=f"telescope-{kind}-{worker_index}-", suffix=".log")
    os.close(handle)
    return Path(name)


def _tail(path: Path, lines: int = 40) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    return ""


class ProcessServer(InferenceServer):
    """An inference server living in a child process."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        address: ServerAddress,
        log_file: Path,
        cleanup: list[Path] | None = None,
        bind_host: str = "127.0.0.1",
    ) -> None:
        self.process = process
        self._address = address
        self.log_file = log_file
        self._cleanup = cleanup or []
        self.bind_host = bind_host

    @property
    def address(self) -> ServerAddress:
        return self._address

    def wait_until_healthy(self, timeout: float) -> ProcessServer:
        """Return once ``/health`` answers from this process (not another one that holds the port).

        Raises :class:`PortInUseError` when the process exited and its port is held by
        another process, ``RuntimeError`` when it exited otherwise, ``TimeoutError``.
        """
        deadline = time.monotonic() + timeout
        url = f"{self._address.base_url}/health"
        port = self._address.port
        with httpx.Client(timeout=5.0) as http:
            while True:
                if self.process.poll() is not None:
                    error = PortInUseError if _bind(self.bind_host, port) is None else RuntimeError
                    raise error(
                        f"inference server process exited with code {self.process.returncode} before it was "
                        f"healthy; log {self.log_file}:\n{_tail(self.log_file)}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(url).status_code == 200 and listens_on(self.process.pid, port):
                        return self
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(
                        f"inference server at {url} was not healthy within {timeout:.0f} s; "
                        f"log {self.log_file}:\n{_tail(self.log_file)}"
                    )
                time.sleep(0.25)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        for path in self._cleanup:
            with contextlib.suppress(OSError):
                path.unlink()


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks the kernel to SIGKILL the child when its parent thread dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)

    return preexec


def spawn(command: list[str], env: dict[str, str], log_file: Path) -> subprocess.Popen[bytes]:
    """Start ``command`` in its own session, output to ``log_file``; it dies with the starting thread (Linux)."""
    with open(log_file, "ab") as out:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent(),
        )
