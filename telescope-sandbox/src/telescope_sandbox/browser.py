"""The ``local`` browser provider: headless Chromium driven by Playwright, one fresh context per session.

:class:`PlaywrightBrowserProvider` is everything below but how a browser is reached (its
``launch``); :class:`LocalBrowserProvider` starts Chromium on this machine. A provider for a
Chromium elsewhere subclasses the first and connects (docs/browser-provider.md).

Design. Playwright's asynchronous API runs on an event loop of the provider's own (one
daemon thread), so any thread (an environment's ``env_response`` runs in a worker
thread) can call a session synchronously: each call is handed to that loop and waited
for, at most the session's action timeout. ``num_browsers`` Chromium processes are
started lazily and sessions are spread over them (round robin); each session is a new
``BrowserContext`` (no cookies, storage or cache shared) with one page.

Containment, per session (:class:`~telescope.api.browser.BrowserLimits`): every request
of the context goes through a route that lets through ``about:``/``data:`` URLs, the
``allowed_origins`` (``scheme://host:port`` prefixes) and ``file://`` paths inside the
``allowed_folders`` (resolved, so ``..`` and links cannot leave them); everything else is
aborted and counted (:attr:`blocked_requests`). Downloads are refused
(``accept_downloads=False``); service workers are blocked. The page's JavaScript heap is
bounded with V8's ``--max-old-space-size`` (the browser's flag, so the largest bound
asked of one browser process applies to its renderers).

Crashes: a browser that disconnects (crashed, killed) is marked dead; its sessions raise
:class:`~telescope.api.browser.BrowserError` at their next action, and the next session
on its slot starts a new browser (counted in :attr:`LocalBrowserProvider.restarts`). A
page that crashes raises the same way.

Chromium: ``executable_path`` (or ``TELESCOPE_CHROMIUM``, else ``/usr/bin/chromium``,
Debian's package): Playwright's own browser download is not used. Limits: no CPU bound
per session; the memory bound is V8's heap, not the renderer's whole footprint.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, ClassVar, TypeVar
from urllib.parse import unquote, urlparse

from telescope.api import events
from telescope.api.browser import BrowserError, BrowserLimits, BrowserProvider, BrowserSession

T = TypeVar("T")

DEFAULT_CHROMIUM = "/usr/bin/chromium"

#: The page-side half of :meth:`PlaywrightBrowserSession.snapshot`: numbers the visible controls
#: (``data-telescope-ref``) and lists them, with the visible text around them, in document order.
SNAPSHOT_JS = """
(root) => {
  const lines = [];
  let next = 0;
  document.querySelectorAll('[data-telescope-ref]').forEach(e => e.removeAttribute('data-telescope-ref'));
  const visible = e => {
    const r = e.getBoundingClientRect();
    const s = getComputedStyle(e);
    return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none';
  };
  // a control: a form or link element, a button role, an onclick, or what the page styles as clickable
  // (a listener added from script is invisible to the page, but its pointer cursor is not)
  const pointer = e => getComputedStyle(e).cursor === 'pointer'
    && !(e.parentElement && getComputedStyle(e.parentElement).cursor === 'pointer');
  const control = e => ['A', 'BUTTON', 'INPUT', 'SELECT', 'TEXTAREA', 'OPTION'].includes(e.tagName)
    || e.getAttribute('role') === 'button' || e.onclick !== null || pointer(e);
  const label = e => {
    if (e.labels && e.labels.length) return e.labels[0].innerText.trim().slice(0, 80);
    if (e.tagName === 'INPUT' || e.tagName === 'TEXTAREA') {
      return (e.placeholder || e.getAttribute('aria-label') || '').trim().slice(0, 80);
    }
    return (e.innerText || e.getAttribute('aria-label') || e.title || '').trim().slice(0, 80);
  };
  const labelled = e => e.tagName === 'LABEL' && e.querySelector('input, select, textarea') !== null;
  const walk = node => {
    for (const child of node.childNodes) {
      if (child.nodeType === Node.TEXT_NODE) {
        const text = child.textContent.trim();
        const parent = child.parentElement;
        if (text && parent && visible(parent) && !control(parent) && !labelled(parent)) {
          lines.push(text.slice(0, 200));
        }
      } else if (child.nodeType === Node.ELEMENT_NODE && visible(child)) {
        if (['SCRIPT', 'STYLE', 'NOSCRIPT'].includes(child.tagName)) continue;
        if (control(child)) {
          const ref = next++;
          child.setAttribute('data-telescope-ref', String(ref));
          let kind = child.tagName.toLowerCase();
          if (kind === 'input') kind = (child.type || 'text');
          if (!['a', 'button', 'select', 'textarea', 'option'].includes(kind) && child.tagName !== 'INPUT') {
            kind = child.getAttribute('role') || 'clickable';
          }
          let line = `[${ref}] ${kind} "${label(child)}"`;
          if (['text', 'textarea', 'password', 'email', 'number', 'search'].includes(kind) && child.value) {
            line += ` value="${child.value.slice(0, 80)}"`;
          }
          if (child.checked) line += ' checked';
          lines.push(line);
          if (child.tagName === 'SELECT') walk(child);
        } else {
          walk(child);
        }
      }
    }
  };
  walk((root && document.querySelector(root)) || document.body || document.documentElement);
  return lines.join('\\n');
}
"""


def chromium_path(executable_path: str | None = None) -> str:
    """The Chromium to drive: the argument, ``TELESCOPE_CHROMIUM``, or Debian's ``/usr/bin/chromium``."""
    path = executable_path or os.environ.get("TELESCOPE_CHROMIUM") or DEFAULT_CHROMIUM
    if not Path(path).exists():
        raise BrowserError(
            f"Chromium not found at {path}: install it (apt-get install chromium) or set TELESCOPE_CHROMIUM "
            "(or the provider's executable_path) to a Chrome or Chromium binary"
        )
    return path


def is_allowed(url: str, limits: BrowserLimits) -> bool:
    """Whether a session with ``limits`` may load ``url`` (see the module docstring)."""
    if url.startswith(("about:", "data:")):
        return True
    if url.startswith("file:"):
        path = Path(unquote(urlparse(url).path)).resolve()
        return any(path.is_relative_to(Path(folder).resolve()) for folder in limits.allowed_folders)
    parsed = urlparse(url)
    origin = f"{parsed.scheme}://{parsed.netloc}"
    return any(origin == allowed.rstrip("/") for allowed in limits.allowed_origins)


class _Loop:
    """An event loop on a daemon thread of its own; :meth:`run` waits for a coroutine from any other thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="telescope-browser", daemon=True)
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None) -> T:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise BrowserError(f"a browser action did not finish within {timeout_s:g} s") from None

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class _Browser:
    """One Chromium process (a slot of the pool); ``alive`` turns False when it disconnects."""

    def __init__(self, browser: Any) -> None:
        self.browser = browser
        self.alive = True
        browser.on("disconnected", lambda _: setattr(self, "alive", False))


class PlaywrightBrowserProvider(BrowserProvider):
    """Sessions on Chromium browsers that Playwright drives; a subclass says how a browser is reached.

    Everything but :meth:`launch` is here: the loop thread, ``num_browsers`` slots filled on
    first use and refilled after a crash (counted in :attr:`restarts`), and the sessions with
    their containment (see the module docstring). :meth:`launch` returns a Playwright
    ``Browser``: the local provider starts one; a provider for a Chromium elsewhere connects
    to it (``playwright.chromium.connect_over_cdp(endpoint)``), see docs/browser-provider.md.
    """

    def __init__(self, *, num_browsers: int = 1, default_limits: BrowserLimits | None = None) -> None:
        if num_browsers < 1:
            raise ValueError(f"num_browsers must be at least 1, got {num_browsers}")
        self.default_limits = default_limits or BrowserLimits()
        self.num_browsers = num_browsers
        self._loop: _Loop | None = None
        self._playwright: Any = None
        self._slots: list[_Browser | None] = [None] * num_browsers
        self._next_slot = itertools.count()
        self._lock = threading.Lock()
        self._restarts = 0
        self._closed = False

    async def launch(self, playwright: Any, limits: BrowserLimits) -> Any:
        """A new Playwright ``Browser`` for a slot (``limits``: those of the session that asked for it)."""
        raise NotImplementedError

    @property
    def restarts(self) -> int:
        return self._restarts

    def open(self, limits: BrowserLimits | None = None) -> BrowserSession:
        limits = limits or self.default_limits
        with self._lock:
            if self._closed:
                raise BrowserError("the browser provider is closed")
            if self._loop is None:
                self._loop = _Loop()
            slot = next(self._next_slot) % self.num_browsers
            browser = self._loop.run(self._browser(slot, limits), timeout_s=60.0)
        session = PlaywrightBrowserSession(self._loop, browser, limits)
        self._loop.run(session.start(), timeout_s=limits.action_timeout_s + 30.0)
        return session

    async def _browser(self, slot: int, limits: BrowserLimits) -> _Browser:
        from playwright.async_api import async_playwright

        current = self._slots[slot]
        if current is not None and current.alive:
            return current
        if current is not None:
            self._restarts += 1
        if self._playwright is None:
            self._playwright = await async_playwright().start()
        self._slots[slot] = browser = _Browser(await self.launch(self._playwright, limits))
        return browser

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop = self._loop
        if loop is None:
            return

        async def shut() -> None:
            for slot in self._slots:
                if slot is not None and slot.alive:
                    await slot.browser.close()
            if self._playwright is not None:
                await self._playwright.stop()

        try:
            loop.run(shut(), timeout_s=30.0)
        finally:
            loop.stop()


class LocalBrowserProvider(PlaywrightBrowserProvider):
    """Headless Chromium via Playwright on this machine (see the module docstring)."""

    name: ClassVar[str] = "local"

    def __init__(
        self,
        *,
        num_browsers: int = 1,
        executable_path: str | None = None,
        default_limits: BrowserLimits | None = None,
    ) -> None:
        super().__init__(num_browsers=num_browsers, default_limits=default_limits)
        self.executable_path = chromium_path(executable_path)
        # A switch Chromium ignores, so that this provider's browsers can be told apart from
        # any other Chromium started by the same process (another provider, a test's own).
        self._process_marker = f"--telescope-browser-pool={uuid.uuid4().hex}"

    async def launch(self, playwright: Any, limits: BrowserLimits) -> Any:
        args = [
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--js-flags=--max-old-space-size={limits.js_heap_mb}",
            self._process_marker,
        ]
        return await playwright.chromium.launch(executable_path=self.executable_path, headless=True, args=args)

    def browser_processes(self) -> list[Any]:
        """This provider's browsers' main processes (``psutil.Process``; Playwright names no pid), for
        memory figures and for tests that kill one: the processes under this one whose command line
        carries the provider's marker switch and whose parent's does not (renderers and helpers are
        the main process's children)."""
        import psutil

        found = []
        for child in psutil.Process().children(recursive=True):
            try:
                if self._process_marker in child.cmdline() and self._process_marker not in child.parent().cmdline():
                    found.append(child)
            except psutil.Error:
                continue
        return found


class PlaywrightBrowserSession(BrowserSession):
    """A fresh context and page on one of the provider's browsers."""

    def __init__(self, loop: _Loop, browser: _Browser, limits: BrowserLimits) -> None:
        self.session_id = uuid.uuid4().hex[:12]
        self._loop = loop
        self._browser = browser
        self.limits = limits
        self._blocked = 0
        self._context: Any = None
        self._page: Any = None
        self._closed = False
        self._crashed = False

    async def start(self) -> None:
        width, height = self.limits.viewport
        context = await self._browser.browser.new_context(
            accept_downloads=False, service_workers="block", viewport={"width": width, "height": height}
        )
        await context.route("**/*", self._route)
        page = await context.new_page()
        page.set_default_timeout(self.limits.action_timeout_s * 1000)
        page.on("crash", lambda _: setattr(self, "_crashed", True))
        self._context, self._page = context, page

    async def _route(self, route: Any) -> None:
        if is_allowed(route.request.url, self.limits):
            await route.continue_()
        else:
            self._blocked += 1
            events.emit("browser.blocked", session_id=self.session_id, url=route.request.url[:200])
            await route.abort("blockedbyclient")

    @property
    def blocked_requests(self) -> int:
        return self._blocked

    def _call(self, action: str, coroutine: Coroutine[Any, Any, T], **fields: Any) -> T:
        if self._closed:
            coroutine.close()
            raise BrowserError(f"session {self.session_id} is closed")
        if not self._browser.alive or self._crashed:
            coroutine.close()
            raise BrowserError(f"session {self.session_id}: its browser {'page ' if self._crashed else ''}crashed")
        with events.timed(f"browser.{action}", session_id=self.session_id, **fields):
            try:
                return self._loop.run(coroutine, self.limits.action_timeout_s + 5.0)
            except BrowserError:
                raise
            except Exception as exc:  # Playwright's errors (timeouts, a closed target) and a dead browser
                raise BrowserError(f"browser {action} failed: {type(exc).__name__}: {str(exc)[:300]}") from exc

    def goto(self, url: str) -> None:
        if not is_allowed(url, self.limits):
            self._blocked += 1
            raise BrowserError(
                f"{url[:200]} is not allowed by this session's limits (allowed_origins, allowed_folders)"
            )
        self._call("goto", self._page.goto(url, wait_until="load"), url=url[:200])

    def evaluate(self, expression: str) -> Any:
        return self._call("evaluate", self._page.evaluate(expression))

    def snapshot(self, root: str | None = None) -> str:
        text: str = self._call("snapshot", self._page.evaluate(SNAPSHOT_JS, root))
        return text

    async def _element(self, ref: int) -> Any:
        """The control numbered ``ref`` in the last snapshot; a number it did not give fails at once."""
        locator = self._page.locator(f'[data-telescope-ref="{int(ref)}"]')
        if await locator.count() == 0:
            raise BrowserError(f"no element numbered {ref} in the last snapshot")
        return locator

    def click(self, ref: int) -> None:
        async def click() -> None:
            await (await self._element(ref)).click()

        self._call("click", click(), ref=ref)

    def type(self, ref: int, text: str) -> None:
        async def fill() -> None:
            locator = await self._element(ref)
            await locator.click()
            await locator.press_sequentially(text)

        self._call("type", fill(), ref=ref, chars=len(text))

    def press(self, key: str) -> None:
        self._call("press", self._page.keyboard.press(key), key=key)

    def scroll(self, dy: int) -> None:
        self._call("scroll", self._page.mouse.wheel(0, dy), dy=dy)

    def screenshot(self, root: str | None = None) -> bytes:
        target = self._page.locator(root).first if root else self._page
        data: bytes = self._call("screenshot", target.screenshot(type="png"))
        return data

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._context is None or not self._browser.alive:
            return
        start = time.perf_counter()
        try:
            self._loop.run(self._context.close(), timeout_s=10.0)
        except Exception:  # a browser that died meanwhile took the context with it
            pass
        finally:
            events.emit("browser.close", session_id=self.session_id, duration_s=time.perf_counter() - start)
