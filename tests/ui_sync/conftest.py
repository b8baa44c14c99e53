"""Fixtures of the dashboard tests: run directories written by the real run store, a real
short training run (once per session), and a served dashboard.

``real_run`` trains ``configs/examples/countdown_tiny.yaml`` for 3 steps (about two
minutes on Ray); set ``TELESCOPE_UI_TEST_RUN`` to an existing run directory to reuse one.
Tests get copies, so they may append to or delete them.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("duckdb")
pytest.importorskip("fastapi")

from telescope.recording.run_store import RunStore

REPO = Path(__file__).resolve().parents[2]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """A browser test that waited in vain for an element fails naming it, with the page's state.

    Playwright's timeout says only how long it waited; the report gains a section with the
    element waited for, the page's URL, its script errors and the start of its visible text,
    so a missing element reads as such and not as a slow machine.
    """
    report = yield
    page = getattr(item, "funcargs", {}).get("page")
    if call.excinfo is None or page is None or type(call.excinfo.value).__name__ != "TimeoutError":
        return report
    message = str(call.excinfo.value)
    waited = [line.strip() for line in message.splitlines() if "waiting for" in line]
    try:
        text = page.inner_text("body")[:1500]
        url = page.url
    except Exception as error:  # the page itself is gone: say so instead
        text, url = f"(the page could not be read: {error})", "?"
    report.sections.append(
        (
            "missing element",
            "\n".join(
                [
                    f"not found: {waited[0] if waited else message.splitlines()[0]}",
                    f"page: {url}",
                    f"script errors: {getattr(page, 'errors', [])}",
                    "visible text:",
                    text,
                ]
            ),
        )
    )
    return report


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_run(
    run_dir: Path,
    steps: int = 4,
    *,
    status: str = "completed",
    completion: str = "<answer>4</answer>",
    first_rollout: dict[str, Any] | None = None,
) -> Path:
    """A small run directory written through the real :class:`RunStore`."""
    store = RunStore(run_dir)
    store.write_config(
        "number_of_steps: 10\n",
        {
            "number_of_steps": 10,
            "max_tokens": 32,
            "environments": [{"name": "countdown", "reward_min": 0.0, "reward_max": 2.0}],
        },
    )
    store.set_status("running", step=0)
    for step in range(steps):
        store.log_metrics(
            step,
            {
                "reward/mean": 0.1 * step,
                "grad_norm": 1.0 + step,
                "timing_step_total": 0.5,
                "sample_metrics/correct/mean": 0.5,
            },
        )
        store.log_rollouts(
            step,
            [
                {
                    "group_index": g,
                    "rollout_index": i,
                    "sample_id": f"s{g}",
                    "environment": "countdown",
                    "prompt": f"prompt {step} {g}",
                    "completion": completion if i == 0 else f"c{step}{g}{i}",
                    "reward": float(i % 2),
                    "advantage": 0.5 - (i % 2),
                    "completion_tokens": 5,
                    "messages": [
                        {"role": "user", "content": "q"},
                        {"role": "tool", "content": f"tool output {step}-{g}-{i}"},
                    ],
                    **((first_rollout or {}) if g == i == 0 else {}),
                }
                for g in range(2)
                for i in range(4)
            ],
        )
        store.log_event(
            {
                "kind": "sandbox.execute",
                "start": 1000.0 + step,
                "duration_s": 0.2,
                "component": "sandbox",
                "sandbox_id": "sb-1",
                "command": "python main.py",
                "exit_code": step % 2,
                "step": step,
            }
        )
    store.log_event(
        {
            "kind": "infra.system",
            "start": 1000.0,
            "duration_s": 0.0,
            "component": "system",
            "node": 0,
            "cpu_utilization_percent": 42.0,
        }
    )
    store.log_eval("countdown", steps, {"eval/countdown/reward_mean": 0.25}, phase="after")
    with store.log_path("orchestrator").open("w") as log:
        log.write("2026-01-02 03:04:05,678 INFO telescope.orchestrator: step 0 done\n")
        log.write("2026-01-02 03:04:06,000 ERROR telescope.orchestrator: something failed\n")
    store.set_status(status, step=steps)  # type: ignore[arg-type]
    store.close()
    return run_dir


def png_bytes(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A real PNG of one colour (8-bit RGB), as a browser screenshot is."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


#: What the model of :func:`write_browser_run`'s episode saw first, and after its first reply.
FIRST_PAGE = 'Task: Click the button named ok.\nPage:\nFIRST-PAGE\n[1] button "ok"\n[2] button "cancel"'
SECOND_PAGE = 'Task: Click the button named ok.\nPage:\nSECOND-PAGE\n[3] text ""'
#: The browser sessions of :func:`write_browser_run`: (session, [(kind, start offset, duration)]).
#: Session ``b`` runs inside ``a``'s span and no two actions overlap: a row per action's overlap
#: would be one row; a row per session, two.
SESSIONS = (
    ("aaaaaaaaaaaa", [("goto", 0.0, 0.5), ("snapshot", 0.6, 0.1), ("click", 5.0, 0.3), ("close", 6.0, 0.1)]),
    ("bbbbbbbbbbbb", [("goto", 1.0, 0.5), ("snapshot", 1.6, 0.1), ("type", 2.0, 0.4), ("close", 3.0, 0.1)]),
)


def write_browser_run(run_dir: Path, start: float = 1000.0) -> Path:
    """A run with one miniwob-like episode (two replies of ``<tool_call>`` blocks, the pages it
    saw, two screenshots: turn 0 red, turn 1 blue) among plain rollouts, and the browser events
    of two sessions (:data:`SESSIONS`) beside a sandbox's and a weight update's."""
    store = RunStore(run_dir)
    store.write_config("number_of_steps: 2\n", {"number_of_steps": 2, "environments": [{"name": "miniwob"}]})
    store.set_status("running", step=0)
    store.log_metrics(0, {"reward/mean": 0.5, "timing_step_total": 7.0}, timestamp=start + 7.0)
    prompt = [
        {"role": "system", "content": "Tools: click(ref), type_text(ref, text)."},
        {"role": "user", "content": FIRST_PAGE},
    ]
    episode = {
        "group_index": 0,
        "rollout_index": 0,
        "sample_id": "miniwob-click-button-0",
        "environment": "miniwob",
        "prompt": prompt,
        "completion": "…",
        "messages": [
            *prompt,
            {
                "role": "assistant",
                "content": 'OK-REPLY <tool_call>{"name": "click", "arguments": {"ref": 1}}</tool_call>',
            },
            {"role": "tool", "content": SECOND_PAGE},
            {
                "role": "assistant",
                "content": '<tool_call>{"name": "type_text", "arguments": {"ref": 3, "text": "ada"}}</tool_call>',
            },
            {"role": "tool", "content": "The task is over."},
        ],
        "reward": 1.0,
        "num_turns": 2,
        "sample_metrics": {"success": 1.0, "actions": 2.0, "blocked_requests": 0.0, "screenshot_failures": 0.0},
        "attachments": [
            {"name": "page", "media_type": "image/png", "turn": 0, "data": png_bytes(32, 24, (220, 20, 20))},
            {"name": "page", "media_type": "image/png", "turn": 1, "data": png_bytes(48, 20, (20, 20, 220))},
        ],
    }
    plain = {"group_index": 1, "rollout_index": 0, "prompt": "p", "completion": "c", "reward": 0.0}
    store.log_rollouts(0, [episode, plain])
    for session, actions in SESSIONS:
        for kind, offset, duration in actions:
            store.log_event(
                {
                    "kind": f"browser.{kind}",
                    "start": start + offset,
                    "duration_s": duration,
                    "session_id": session,
                    "step": 0,
                    "sample_id": "miniwob-click-button-0",
                }
            )
    store.log_event({"kind": "sandbox.execute", "start": start + 0.2, "duration_s": 0.2, "sandbox_id": "sb-1"})
    store.log_event({"kind": "weights.update", "start": start + 4.0, "duration_s": 0.5})
    store.set_status("completed", step=1)
    store.close()
    return run_dir


def write_blocks(run: Path, blocks: int, per_block: int = 8) -> None:
    """A run whose rollouts are in ``blocks`` sealed blocks of ``per_block`` rollouts (one step each)."""
    store = RunStore(run, rollout_block_size=per_block)
    store.set_status("running", step=0)
    for step in range(blocks):
        store.log_metrics(step, {"reward/mean": 0.5})
        rollouts = [
            {"group_index": 0, "rollout_index": i, "prompt": f"p{step}", "completion": "c", "reward": 1.0}
            for i in range(per_block)
        ]
        store.log_rollouts(step, rollouts)
        store.set_status("running", step=step + 1)
    store.close()


@pytest.fixture(scope="session")
def real_run_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 3-step training run's directory (made once per test session).

    Under pytest-xdist each worker has a session of its own; the workers' base temp
    folders share a parent that is new with every ``pytest -n`` call, so the first
    worker to get here makes the run there, under a file lock, and the others wait for
    it and read the same one (xdist's ``loadgroup`` would have kept these tests on one
    worker, but it does not group with pytest 9.2: pytest-xdist issue 1386).
    """
    reuse = os.environ.get("TELESCOPE_UI_TEST_RUN")
    if reuse:
        return Path(reuse)
    pytest.importorskip("telescope_envs")
    from filelock import FileLock

    shared = os.environ.get("PYTEST_XDIST_WORKER") is not None
    root = tmp_path_factory.getbasetemp().parent if shared else tmp_path_factory.getbasetemp()
    run_dir, made = root / "real-run" / "countdown-tiny", root / "real-run.made"
    with FileLock(str(root / "real-run.lock")):
        if not made.exists():
            _make_real_run(run_dir)
            made.write_text(str(run_dir))
    return run_dir


def _make_real_run(run_dir: Path) -> None:
    shutil.rmtree(run_dir, ignore_errors=True)  # what a failed attempt left
    code = "import sys; from telescope.cli.main import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "WANDB_MODE": "disabled", "TELESCOPE_PROGRESS": "lines"}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "run",
            str(REPO / "configs/examples/countdown_tiny.yaml"),
            "--number_of_steps",
            "3",
            "--warm_start_steps",
            "20",
            "--run_dir",
            str(run_dir),
            "--inference_base_port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture
def real_runs(real_run_source: Path, tmp_path: Path) -> Path:
    """A folder holding a copy of the real run (``countdown-tiny``); tests may change it."""
    folder = tmp_path / "runs"
    folder.mkdir()
    shutil.copytree(real_run_source, folder / "countdown-tiny", ignore=shutil.ignore_patterns("checkpoints"))
    return folder


@dataclass
class Served:
    url: str
    service: object
    con: object


@pytest.fixture
def serve() -> Iterator[object]:
    """``serve(roots) -> Served``: the dashboard over ``roots`` on a free port, syncing every 0.2 s."""
    import uvicorn

    from telescope_ui_sync.server.app import create_app
    from telescope_ui_sync.sync.schema import connect
    from telescope_ui_sync.sync.syncer import SyncService

    started: list[tuple[uvicorn.Server, SyncService, threading.Thread]] = []

    def start(roots: list[Path], db: Path | str = ":memory:") -> Served:
        con = connect(db)
        service = SyncService(con.cursor(), roots, poll_interval=0.2)
        service.sync_all()
        service.start()
        server = uvicorn.Server(  # port 0: the system's choice, read back once listening (no race for it)
            uvicorn.Config(create_app(con, service), host="127.0.0.1", port=0, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.time() + 20
        while not server.started and time.time() < deadline:
            time.sleep(0.05)
        started.append((server, service, thread))
        assert server.started, "the dashboard's server did not start within 20 s"
        port = server.servers[0].sockets[0].getsockname()[1]
        return Served(url=f"http://127.0.0.1:{port}", service=service, con=con)

    yield start
    for server, service, thread in started:
        server.should_exit = True
        thread.join(10)
        service.stop()
