"""The browser-provider interface: fresh, contained browser sessions for environments that act on web pages.

A provider opens sessions; a session is one fresh browser context with one page (no
cookies, storage or cache shared with any other session), a per-action timeout, a
JavaScript heap bound, and a network allow-list: the page may load only the origins
and local folders its :class:`BrowserLimits` name; every other request is blocked and
counted, downloads are refused. Every action is a timeline event (``browser.<action>``
on :mod:`telescope.api.events`).

The API is synchronous, as the sandbox one is: an environment's ``env_response`` and
reward functions run in worker threads. A provider backed by an asynchronous driver
(Playwright) runs it on a thread of its own and hands the calls over.

The observation a model reads is :meth:`BrowserSession.snapshot`: the page's visible
text and controls as lines, each control with a reference number (``[3] button
"Submit"``) that the actions take (:meth:`click`, :meth:`type`). The references of a
snapshot hold until the next one.

Failures: a session whose browser crashed or was killed raises :class:`BrowserError`
on its next action (the environment errors that episode; the run goes on) and the
provider starts a new browser for the next sessions, counting it (``restarts``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class BrowserLimits:
    """What one session may do. ``allowed_origins``: ``scheme://host:port`` prefixes it may load;
    ``allowed_folders``: local folders whose files it may load as ``file://`` URLs."""

    action_timeout_s: float = 10.0
    js_heap_mb: int = 256
    allowed_origins: tuple[str, ...] = ()
    allowed_folders: tuple[str, ...] = ()
    viewport: tuple[int, int] = (800, 600)


class BrowserError(RuntimeError):
    """A session could not be opened or used (its browser crashed, an action failed or timed out)."""


class BrowserSession(ABC):
    """One fresh browser context with one page. Close it when done (it is also a context manager)."""

    session_id: str = ""

    @abstractmethod
    def goto(self, url: str) -> None:
        """Load ``url`` (it must be allowed by the session's limits)."""

    @abstractmethod
    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable)."""

    @abstractmethod
    def snapshot(self, root: str | None = None) -> str:
        """The visible text and controls of the page (or of the element the CSS selector ``root`` names),
        one per line, controls numbered for the actions: ``[3] button "Submit"``, ``[4] checkbox "AU" checked``."""

    @abstractmethod
    def click(self, ref: int) -> None:
        """Click the control numbered ``ref`` in the last snapshot."""

    @abstractmethod
    def type(self, ref: int, text: str) -> None:
        """Focus the control numbered ``ref`` and type ``text`` into it."""

    @abstractmethod
    def press(self, key: str) -> None:
        """Press a key (``Enter``, ``Tab``, ``ArrowDown``, ...) on the focused element."""

    @abstractmethod
    def scroll(self, dy: int) -> None:
        """Scroll the page by ``dy`` pixels (negative: up)."""

    @abstractmethod
    def screenshot(self, root: str | None = None) -> bytes:
        """The page (or the element the CSS selector ``root`` names) as a PNG."""

    @property
    @abstractmethod
    def blocked_requests(self) -> int:
        """Requests this session's page made that its limits refused."""

    @abstractmethod
    def close(self) -> None:
        """Close the context and everything in it (idempotent)."""

    def __enter__(self) -> BrowserSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BrowserProvider(ABC):
    """Opens browser sessions.

    A run builds a provider by its registered name (the ``browser_provider`` setting, or an
    environment's own ``browser_provider`` keyword argument) with the environment's
    ``browser_provider_kwargs`` as keyword arguments; :class:`telescope.testing.browser.
    BrowserProviderConformance` is the kit a provider passes.
    """

    name: ClassVar[str] = ""

    @abstractmethod
    def open(self, limits: BrowserLimits | None = None) -> BrowserSession:
        """A fresh session with ``limits`` (or the provider's defaults)."""

    @property
    def restarts(self) -> int:
        """Browsers started again after a crash or a kill."""
        return 0

    def close(self) -> None:
        """Release provider-wide resources (browser processes)."""
