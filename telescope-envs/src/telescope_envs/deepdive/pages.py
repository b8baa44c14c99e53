"""Page backends for ``scan_page`` and ``open_lines``: the interface and HTTP fetching.

A page backend turns a url into a :class:`Page`: its readable text, or an error
text. A page that cannot be fetched (404, timeout, an unreadable format) is part
of the web the agent explores, not a failure of the run: it comes back as a
``Page`` with ``error`` set, which the model sees, as upstream does. Backends are
shared by every rollout: thread-safe, no per-rollout state.

:class:`HttpPages` fetches with ``httpx`` (redirects followed, ``timeout``, at most
``max_bytes`` read), turns HTML into text (scripts, styles and SVG dropped, block
tags as line breaks, entities unescaped, blank runs squeezed) and PDF into text
with ``pdfminer.six`` when it is installed (``pip install 'telescope-envs[deepdive]'``; without
it a PDF is a page error naming the package). Fetched pages are kept in a bounded
LRU cache (``cache_size`` pages, shared by rollouts, so the agents of one group
reading the same page fetch it once).

Not done (upstream does): a disk cache shared between processes, following a PDF
embedded in an HTML page.

The offline backend is :class:`telescope_envs.deepdive.corpus.LocalPages`.
"""

from __future__ import annotations

import html
import io
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlparse

import httpx

_SKIP_TAGS = {"script", "style", "noscript", "svg", "head"}
_BREAK_TAGS = {"br", "p", "div", "li", "tr", "td", "th", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "section"}


@dataclass(frozen=True)
class Page:
    """A page's text (``content``) or, when it could not be read, ``content=None`` and ``error``."""

    url: str
    content: str | None
    page_format: str = "text"
    error: str | None = None


@runtime_checkable
class PageBackend(Protocol):
    """What the page tools call: never raises for an unreadable page (returns a Page with error)."""

    def open(self, url: str) -> Page: ...


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.chunks: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP_TAGS:
            self.skip += 1
        elif not self.skip and tag in _BREAK_TAGS:
            self.chunks.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP_TAGS:
            self.skip = max(0, self.skip - 1)
        elif not self.skip and tag in _BREAK_TAGS:
            self.chunks.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.chunks.append(data)


def clean_text(text: str) -> str:
    """Trailing blanks removed, runs of blank lines squeezed to one, words split by hyphenation joined."""
    text = text.replace("\xa0", " ")
    text = re.sub(r"[ \t]{2,}", " ", text)
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n[ \t]+", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    text = re.sub(r"(\w+)-\n(\w+)", r"\1\2", text)
    return text.replace("\f", "\n\n---\n\n").strip()


def html_to_text(markup: str) -> str:
    """The readable text of an HTML document, one block per line."""
    parser = _TextExtractor()
    try:
        parser.feed(markup)
        parser.close()
    except Exception:  # HTMLParser is lenient; keep whatever was read
        pass
    return clean_text(html.unescape("".join(parser.chunks)))


def looks_like_pdf(url: str, content_type: str, body: bytes) -> bool:
    return (
        "pdf" in content_type.lower()
        or urlparse(url).path.lower().endswith(".pdf")
        or body.lstrip(b"\r\n\t\f\x00").startswith(b"%PDF-")
    )


def pdf_to_text(body: bytes) -> str:
    """PDF text with pdfminer.six (ImportError when it is not installed)."""
    from pdfminer.high_level import extract_text

    return str(extract_text(io.BytesIO(body)))


class HttpPages:
    """Pages fetched over HTTP(S), as text, with a bounded shared LRU cache."""

    def __init__(
        self, timeout: float = 30.0, max_bytes: int = 5_000_000, cache_size: int = 256, user_agent: str = "Mozilla/5.0"
    ) -> None:
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.cache_size = cache_size
        self.user_agent = user_agent
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Page] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_lock": None, "_cache": OrderedDict()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def client(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(
                    timeout=self.timeout, follow_redirects=True, headers={"User-Agent": self.user_agent}
                )
            return self._client

    def open(self, url: str) -> Page:
        url = url.strip()
        with self._lock:
            cached = self._cache.get(url)
            if cached is not None:
                self._cache.move_to_end(url)
                return cached
        page = self._fetch(url)
        if page.error is None and self.cache_size > 0:  # errors may be transient: not cached
            with self._lock:
                self._cache[url] = page
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return page

    def _fetch(self, url: str) -> Page:
        if urlparse(url).scheme not in ("http", "https"):
            return Page(url, None, "error", f"Error fetching {url}: only http(s) urls can be opened")
        try:
            with self.client().stream("GET", url) as response:
                if response.status_code >= 400:
                    return Page(url, None, "error", f"Error fetching {url}: HTTP {response.status_code}")
                body = b""
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) >= self.max_bytes:
                        body = body[: self.max_bytes]
                        break
                content_type = response.headers.get("content-type", "")
                encoding = response.charset_encoding or "utf-8"
        except httpx.HTTPError as exc:
            return Page(url, None, "error", f"Error fetching {url}: {type(exc).__name__}: {exc}")
        if looks_like_pdf(url, content_type, body):
            try:
                return Page(url, clean_text(pdf_to_text(body)), "pdf->text")
            except ImportError:
                hint = "PDF pages need pdfminer.six (pip install 'telescope-envs[deepdive]')"
                return Page(url, None, "error", f"Error reading {url}: {hint}")
            except Exception as exc:
                return Page(url, None, "error", f"Error reading {url}: unreadable PDF ({type(exc).__name__})")
        try:
            text = body.decode(encoding, errors="ignore")
        except LookupError:
            text = body.decode("utf-8", errors="ignore")
        if "html" in content_type.lower() or "<html" in text[:2000].lower():
            return Page(url, html_to_text(text), "html->text")
        return Page(url, clean_text(text), "text")

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
