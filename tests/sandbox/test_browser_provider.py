"""The local browser provider: fresh sessions, the network allow-list, no downloads, crashes contained.

A real headless Chromium (Debian's, or ``TELESCOPE_CHROMIUM``) driven by Playwright; the
pages come from a local HTTP server on loopback (the allowed origin) and a task folder
(the allowed ``file://`` folder). Skips without Chromium or Playwright.
"""

from __future__ import annotations

import http.server
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from telescope.api import events
from telescope.api.browser import BrowserError, BrowserLimits

pytest.importorskip("playwright", reason="pip install playwright")
CHROMIUM = os.environ.get("TELESCOPE_CHROMIUM", "/usr/bin/chromium")
pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium is not installed (apt-get install chromium)"),
    pytest.mark.timeout(300),
]

PAGE = """<html><body>
<p id="intro">Click the button named ok.</p>
<button id="ok" onclick="document.title='clicked'">ok</button>
<input id="name" type="text">
<a href="/other.html">other page</a>
<script>document.cookie = "visited=yes";</script>
</body></html>"""


class Server:
    """A loopback HTTP server over a folder, counting the paths asked of it."""

    def __init__(self, root: Path) -> None:
        asked = self.asked = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(root), **kwargs)

            def do_GET(self) -> None:
                asked.append(self.path)
                if self.path.startswith("/download"):
                    self.send_response(200)
                    self.send_header("Content-Disposition", "attachment; filename=x.bin")
                    self.end_headers()
                    self.wfile.write(b"0" * 1000)
                    return
                super().do_GET()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Server]:
    root = tmp_path / "site"
    root.mkdir()
    (root / "task.html").write_text(PAGE)
    (root / "other.html").write_text("<html><body><p>other</p></body></html>")
    (root / "leak.html").write_text(
        '<html><body><img src="http://127.0.0.2:9/tracker.png"><script>fetch("https://example.com/x")'
        ".catch(() => {});</script><p>leak</p></body></html>"
    )
    server = Server(root)
    yield server
    server.close()


@pytest.fixture
def provider() -> Iterator[Any]:
    from telescope_sandbox.browser import LocalBrowserProvider

    instance = LocalBrowserProvider(num_browsers=1, executable_path=CHROMIUM)
    yield instance
    instance.close()


def limits_for(site: Server, action_timeout_s: float = 10.0) -> BrowserLimits:
    return BrowserLimits(action_timeout_s=action_timeout_s, allowed_origins=(site.origin,))


def test_a_session_sees_the_page_as_numbered_controls_and_acts_on_them(provider: Any, site: Server) -> None:
    seen: list[dict[str, Any]] = []
    unsubscribe = events.subscribe(seen.append)
    try:
        with provider.open(limits_for(site)) as session:
            session.goto(f"{site.origin}/task.html")
            lines = session.snapshot().splitlines()
            assert "Click the button named ok." in lines
            ok = next(int(line[1 : line.index("]")]) for line in lines if line.endswith('button "ok"'))
            field = next(int(line[1 : line.index("]")]) for line in lines if "] text " in line)
            session.click(ok)
            session.type(field, "ada")
            assert session.evaluate("document.title") == "clicked"
            assert session.evaluate("document.getElementById('name').value") == "ada"
            assert session.screenshot().startswith(b"\x89PNG")
    finally:
        unsubscribe()
    kinds = [e["kind"] for e in seen]
    assert {"browser.goto", "browser.snapshot", "browser.click", "browser.type", "browser.screenshot"} <= set(kinds)
    assert all(e["session_id"] == seen[0]["session_id"] for e in seen if e["kind"].startswith("browser."))


def test_each_session_is_a_fresh_context(provider: Any, site: Server) -> None:
    with provider.open(limits_for(site)) as first:
        first.goto(f"{site.origin}/task.html")
        assert first.evaluate("document.cookie") == "visited=yes"
        first.evaluate("localStorage.setItem('k', 'v')")
    with provider.open(limits_for(site)) as second:
        second.goto(f"{site.origin}/other.html")
        assert second.evaluate("document.cookie") == ""
        assert second.evaluate("localStorage.getItem('k')") is None


def test_a_page_reaches_only_the_allowed_origin_and_the_rest_is_blocked_and_counted(
    provider: Any, site: Server
) -> None:
    with provider.open(limits_for(site)) as session:
        session.goto(f"{site.origin}/leak.html")
        deadline = time.monotonic() + 5
        while session.blocked_requests < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert session.blocked_requests == 2  # the image on another host and the fetch to the internet
        with pytest.raises(BrowserError, match="not allowed"):
            session.goto("https://example.com/")
        assert session.blocked_requests == 3


def test_file_urls_outside_the_task_folder_are_refused(provider: Any, site: Server, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "t.html").write_text("<html><body><p>task</p><iframe src='../secret.txt'></iframe></body></html>")
    (tmp_path / "secret.txt").write_text("secret")
    with provider.open(BrowserLimits(allowed_folders=(str(tasks),))) as session:
        session.goto((tasks / "t.html").as_uri())
        assert "task" in session.snapshot()
        deadline = time.monotonic() + 5
        while session.blocked_requests < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert session.blocked_requests == 1  # the iframe's ../secret.txt
        with pytest.raises(BrowserError, match="not allowed"):
            session.goto((tmp_path / "secret.txt").as_uri())
        with pytest.raises(BrowserError, match="not allowed"):
            session.goto(f"file://{tasks}/../secret.txt")


def test_downloads_are_refused(provider: Any, site: Server, tmp_path: Path) -> None:
    with provider.open(limits_for(site)) as session:
        session.goto(f"{site.origin}/task.html")
        session.evaluate(
            "(() => { const a = document.createElement('a'); a.href = '/download'; a.download = 'x.bin';"
            " document.body.appendChild(a); a.click(); return 1; })()"
        )
        time.sleep(0.5)
        assert session.evaluate("document.title") != "downloaded"
    assert not list(tmp_path.rglob("x.bin"))


def test_a_killed_browser_errors_its_sessions_and_is_replaced(provider: Any, site: Server) -> None:
    session = provider.open(limits_for(site))
    session.goto(f"{site.origin}/task.html")
    [process] = provider.browser_processes()
    os.kill(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    with pytest.raises(BrowserError):
        while time.monotonic() < deadline:  # the disconnect arrives asynchronously
            session.snapshot()
            time.sleep(0.1)
    session.close()
    with provider.open(limits_for(site)) as fresh:
        fresh.goto(f"{site.origin}/other.html")
        assert "other" in fresh.snapshot()
    assert provider.restarts == 1


def test_an_action_that_never_ends_times_out(provider: Any, site: Server) -> None:
    with provider.open(limits_for(site, action_timeout_s=1.0)) as session:
        session.goto(f"{site.origin}/task.html")
        with pytest.raises(BrowserError, match=r"did not finish|Timeout"):
            session.evaluate("new Promise(() => {})")
        assert "ok" in session.snapshot()  # the session is still usable
