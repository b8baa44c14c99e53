"""Conformance kit for browser providers: inherit, give a provider factory, run pytest.

Usage, in the provider package's own tests::

    from telescope.testing.browser import BrowserProviderConformance

    class TestMyProvider(BrowserProviderConformance):
        def provider_factory(self):
            return MyProvider(endpoint=...)

Every inherited ``test_*`` method checks one part of the contract of
:mod:`telescope.api.browser` against pages the kit serves itself (:class:`LoopbackSite`,
an HTTP server on ``127.0.0.1``): the snapshot numbers the controls and the actions take
those numbers, each action is a ``browser.<action>`` event with the session's id, a number
the last snapshot did not give fails at once, sessions are fresh contexts (no cookies or
storage shared), a page reaches only its allowed origins (the rest blocked and counted), a
disallowed ``goto`` is refused, an action that never ends times out and leaves the session
usable, screenshots are PNGs (of the page or of one element), and ``close`` is idempotent.

What the kit cannot check from outside a provider (its ``file://`` rules, downloads, what
happens when its browser process is killed) belongs in the provider's own tests. The kit
is synchronous and needs pytest only (and whatever the provider drives).
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from telescope.api import events
from telescope.api.browser import BrowserError, BrowserLimits, BrowserProvider, BrowserSession

PAGES = {
    "task.html": """<html><body>
<p id="intro">Click the button named ok.</p>
<button id="ok" onclick="document.title='clicked'">ok</button>
<input id="name" type="text">
<a href="/other.html">other page</a>
<script>document.cookie = "visited=yes";</script>
</body></html>""",
    "other.html": "<html><body><p>other</p></body></html>",
    "leak.html": '<html><body><img src="http://127.0.0.2:9/tracker.png"><script>fetch("https://example.com/x")'
    ".catch(() => {});</script><p>leak</p></body></html>",
}


class LoopbackSite:
    """The kit's pages (:data:`PAGES`, plus any written to ``root``) on a loopback HTTP server.

    ``asked`` lists the paths requested; a path under ``/download`` answers as a file download.
    """

    def __init__(self, root: Path) -> None:
        for name, text in PAGES.items():
            if not (root / name).exists():
                (root / name).write_text(text)
        asked: list[str] = []
        self.asked = asked

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
        threading.Thread(target=self.httpd.serve_forever, name="browser-kit-site", daemon=True).start()

    def limits(self, action_timeout_s: float = 10.0) -> BrowserLimits:
        """Limits that allow this site only."""
        return BrowserLimits(action_timeout_s=action_timeout_s, allowed_origins=(self.origin,))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def ref_of(snapshot: str, suffix: str) -> int:
    """The number of the first control line of ``snapshot`` that contains ``suffix``."""
    for line in snapshot.splitlines():
        if line.startswith("[") and suffix in line:
            return int(line[1 : line.index("]")])
    raise AssertionError(f"no control line with {suffix!r} in the snapshot:\n{snapshot}")


def wait_for_blocked(session: BrowserSession, count: int, timeout_s: float = 5.0) -> int:
    """The session's blocked requests once they reach ``count`` (they are counted as the page makes them)."""
    deadline = time.monotonic() + timeout_s
    while session.blocked_requests < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return session.blocked_requests


class BrowserProviderConformance:
    """Base class of a browser provider's conformance tests (pytest collects the subclass)."""

    #: The action timeout of the timeout test.
    short_timeout_s: ClassVar[float] = 1.0

    def provider_factory(self) -> BrowserProvider:
        raise NotImplementedError("a conformance test class must define provider_factory()")

    @pytest.fixture
    def provider(self) -> Iterator[BrowserProvider]:
        provider = self.provider_factory()
        yield provider
        provider.close()

    @pytest.fixture
    def site(self, tmp_path: Path) -> Iterator[LoopbackSite]:
        root = tmp_path / "site"
        root.mkdir()
        server = LoopbackSite(root)
        yield server
        server.close()

    def test_provider_has_name(self, provider: BrowserProvider) -> None:
        assert isinstance(type(provider).name, str) and type(provider).name

    def test_the_snapshot_numbers_the_controls_and_the_actions_take_the_numbers(
        self, provider: BrowserProvider, site: LoopbackSite
    ) -> None:
        seen: list[dict[str, Any]] = []
        unsubscribe = events.subscribe(seen.append)
        try:
            with provider.open(site.limits()) as session:
                session.goto(f"{site.origin}/task.html")
                page = session.snapshot()
                assert "Click the button named ok." in page.splitlines()
                session.click(ref_of(page, 'button "ok"'))
                session.type(ref_of(page, "] text "), "ada")
                assert session.evaluate("document.title") == "clicked"
                assert session.evaluate("document.getElementById('name').value") == "ada"
                assert 'value="ada"' in session.snapshot()
                session.press("Enter")
                session.scroll(100)
        finally:
            unsubscribe()
        browser_events = [e for e in seen if str(e.get("kind", "")).startswith("browser.")]
        kinds = {e["kind"] for e in browser_events}
        assert {"browser.goto", "browser.snapshot", "browser.click", "browser.type"} <= kinds
        assert {"browser.press", "browser.scroll"} <= kinds
        assert len({e.get("session_id") for e in browser_events}) == 1 and browser_events[0].get("session_id")

    def test_a_number_the_snapshot_did_not_give_fails_at_once(
        self, provider: BrowserProvider, site: LoopbackSite
    ) -> None:
        with provider.open(site.limits(action_timeout_s=30.0)) as session:
            session.goto(f"{site.origin}/task.html")
            session.snapshot()
            start = time.monotonic()
            with pytest.raises(BrowserError, match="no element numbered 999"):
                session.click(999)
            assert time.monotonic() - start < 25.0  # not after the action timeout

    def test_each_session_is_a_fresh_context(self, provider: BrowserProvider, site: LoopbackSite) -> None:
        with provider.open(site.limits()) as first:
            first.goto(f"{site.origin}/task.html")
            assert first.evaluate("document.cookie") == "visited=yes"
            first.evaluate("localStorage.setItem('k', 'v')")
        with provider.open(site.limits()) as second:
            second.goto(f"{site.origin}/other.html")
            assert second.evaluate("document.cookie") == ""
            assert second.evaluate("localStorage.getItem('k')") is None

    def test_a_page_reaches_only_its_allowed_origins(self, provider: BrowserProvider, site: LoopbackSite) -> None:
        with provider.open(site.limits()) as session:
            session.goto(f"{site.origin}/leak.html")
            assert wait_for_blocked(session, 2) == 2  # the image on another host and the fetch to the internet
            with pytest.raises(BrowserError, match="not allowed"):
                session.goto("https://example.com/")
            assert session.blocked_requests == 3
        assert "/leak.html" in site.asked

    def test_an_action_that_never_ends_times_out_and_the_session_goes_on(
        self, provider: BrowserProvider, site: LoopbackSite
    ) -> None:
        with provider.open(site.limits(action_timeout_s=self.short_timeout_s)) as session:
            session.goto(f"{site.origin}/task.html")
            with pytest.raises(BrowserError):
                session.evaluate("new Promise(() => {})")
            assert "ok" in session.snapshot()

    def test_screenshots_are_pngs_of_the_page_or_of_one_element(
        self, provider: BrowserProvider, site: LoopbackSite
    ) -> None:
        with provider.open(site.limits()) as session:
            session.goto(f"{site.origin}/task.html")
            page, element = session.screenshot(), session.screenshot("#ok")
        assert page.startswith(b"\x89PNG") and element.startswith(b"\x89PNG")
        assert len(element) < len(page)  # the button alone is smaller than the whole page

    def test_close_is_idempotent_and_a_closed_session_refuses_actions(
        self, provider: BrowserProvider, site: LoopbackSite
    ) -> None:
        session = provider.open(site.limits())
        session.goto(f"{site.origin}/other.html")
        session.close()
        session.close()
        with pytest.raises(BrowserError):
            session.snapshot()
