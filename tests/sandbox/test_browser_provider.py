"""The local browser provider: the conformance kit, and what only the local provider can show.

A real headless Chromium (Debian's, or ``TELESCOPE_CHROMIUM``) driven by Playwright; the
pages come from the kit's loopback site (the allowed origin) and a task folder (the allowed
``file://`` folder): ``file://`` confinement, refused downloads, a killed browser replaced.
Skips without Chromium or Playwright.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from telescope.api.browser import BrowserError, BrowserLimits, BrowserProvider
from telescope.testing.browser import BrowserProviderConformance, LoopbackSite

pytest.importorskip("playwright", reason="pip install playwright")
CHROMIUM = os.environ.get("TELESCOPE_CHROMIUM", "/usr/bin/chromium")
pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium is not installed (apt-get install chromium)"),
    pytest.mark.timeout(300),
]


class TestLocalBrowserConformance(BrowserProviderConformance):
    def provider_factory(self) -> BrowserProvider:
        from telescope_sandbox.browser import LocalBrowserProvider

        return LocalBrowserProvider(num_browsers=1, executable_path=CHROMIUM)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[LoopbackSite]:
    root = tmp_path / "site"
    root.mkdir()
    server = LoopbackSite(root)
    yield server
    server.close()


@pytest.fixture
def provider() -> Iterator[Any]:
    from telescope_sandbox.browser import LocalBrowserProvider

    instance = LocalBrowserProvider(num_browsers=1, executable_path=CHROMIUM)
    yield instance
    instance.close()


def test_file_urls_outside_the_task_folder_are_refused(provider: Any, site: LoopbackSite, tmp_path: Path) -> None:
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


def test_downloads_are_refused(provider: Any, site: LoopbackSite, tmp_path: Path) -> None:
    with provider.open(site.limits()) as session:
        session.goto(f"{site.origin}/task.html")
        session.evaluate(
            "(() => { const a = document.createElement('a'); a.href = '/download'; a.download = 'x.bin';"
            " document.body.appendChild(a); a.click(); return 1; })()"
        )
        time.sleep(0.5)
        assert session.evaluate("document.title") != "downloaded"
    assert not list(tmp_path.rglob("x.bin"))


def test_a_killed_browser_errors_its_sessions_and_is_replaced(provider: Any, site: LoopbackSite) -> None:
    session = provider.open(site.limits())
    session.goto(f"{site.origin}/task.html")
    [process] = provider.browser_processes()
    os.kill(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    with pytest.raises(BrowserError):
        while time.monotonic() < deadline:  # the disconnect arrives asynchronously
            session.snapshot()
            time.sleep(0.1)
    session.close()
    with provider.open(site.limits()) as fresh:
        fresh.goto(f"{site.origin}/other.html")
        assert "other" in fresh.snapshot()
    assert provider.restarts == 1


def test_browser_processes_are_only_the_providers_own(provider: Any, site: LoopbackSite) -> None:
    from telescope_sandbox.browser import LocalBrowserProvider

    other = LocalBrowserProvider(num_browsers=1, executable_path=CHROMIUM)
    try:
        with other.open(site.limits()) as foreign, provider.open(site.limits()) as own:
            foreign.goto(f"{site.origin}/task.html")
            own.goto(f"{site.origin}/task.html")
            [mine] = provider.browser_processes()
            [theirs] = other.browser_processes()
            assert mine.pid != theirs.pid
    finally:
        other.close()
