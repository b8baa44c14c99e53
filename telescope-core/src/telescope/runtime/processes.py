"""A server running as a child process: start it, wait until ``/health`` answers, stop it.

Shared by the embedded and vLLM backends. The child's stdout and stderr go to a
log file (``<run_dir>/logs/inference_<i>.log``, or a temporary file), whose
tail is quoted when the process dies before it is healthy. Health polling is
bounded by a deadline and fails at once if the process exits.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from telescope.api.inference import InferenceServer, ServerAddress


def connect_host(bind_host: str) -> str:
    """The address a client on this machine uses for a server bound to ``bind_host``."""
    return "127.0.0.1" if bind_host in ("0.0.0.0", "::", "") else bind_host


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
    ) -> None:
        self.process = process
        self._address = address
        self.log_file = log_file
        self._cleanup = cleanup or []

    @property
    def address(self) -> ServerAddress:
        return self._address

    def wait_until_healthy(self, timeout: float) -> ProcessServer:
        deadline = time.monotonic() + timeout
        url = f"{self._address.base_url}/health"
        with httpx.Client(timeout=5.0) as http:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(
                        f"inference server process exited with code {self.process.returncode} before it was "
                        f"healthy; log {self.log_file}:\n{_tail(self.log_file)}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(url).status_code == 200:
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


def spawn(command: list[str], env: dict[str, str], log_file: Path) -> subprocess.Popen[bytes]:
    with open(log_file, "ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
