"""Search backends for ``search_web``: the interface, Serper (the default) and the formatting.

A search backend turns one query into a :class:`SearchResult` (ranked hits, plus
the optional knowledge-graph and "people also ask" parts some engines return). It
is shared by every rollout of the environment, so it must be thread-safe and keep
no per-rollout state. A failure of the service (network, HTTP status, a malformed
reply) raises :class:`BackendError`: the environment counts it and marks the sample
as errored, since a rollout without working search says nothing about the policy.

:class:`SerperSearch` is the upstream deepdive's backend: ``POST`` to
``https://google.serper.dev/search`` with the JSON body ``{"q": query}`` and the
``X-API-KEY`` header; the reply's ``organic`` (``title``, ``link``, ``snippet``),
``knowledgeGraph`` (``title``, ``description``, ``attributes``) and
``peopleAlsoAsk`` (``question``, ``snippet``) parts are read. The URL is
configurable (a proxy, or a local fake in tests). Requests go through one
``httpx.Client`` (created on first use, not pickled), with ``max_retries`` retries
on a connection error, 429 or 5xx.

The local, offline backend is :class:`telescope_envs.deepdive.corpus.LocalSearch`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import httpx

SERPER_API_URL = "https://google.serper.dev/search"
#: Queries beyond this many per ``search_web`` call are ignored (as upstream).
MAX_QUERIES = 10


class BackendError(RuntimeError):
    """A search, page or judge service failed (not the model's fault)."""


@dataclass(frozen=True)
class SearchHit:
    title: str
    url: str
    snippet: str = ""


@dataclass(frozen=True)
class SearchResult:
    """One query's answer: ranked hits and optional extra panels."""

    query: str
    hits: list[SearchHit] = field(default_factory=list)
    knowledge: list[str] = field(default_factory=list)  # knowledge-graph lines
    related: list[tuple[str, str]] = field(default_factory=list)  # (question, answer)


@runtime_checkable
class SearchBackend(Protocol):
    """What ``search_web`` calls: thread-safe, stateless per rollout; raises BackendError on failure."""

    def search(self, query: str, num_results: int) -> SearchResult: ...


def format_result(result: SearchResult, num_results: int) -> str:
    """One query's results as plain text (the upstream's ``format_serper_results``)."""
    sections: list[str] = []
    if result.knowledge:
        sections.append("\n".join(result.knowledge))
    for i, hit in enumerate(result.hits[:num_results]):
        lines = [f"Result {i}: {hit.title.strip() or 'Untitled'}"]
        if hit.url.strip():
            lines.append(f"URL: {hit.url.strip()}")
        if hit.snippet.strip():
            lines.append(hit.snippet.strip())
        sections.append("\n".join(lines))
    related = [(q, a) for q, a in result.related if q.strip()][:3]
    if related:
        entries = [f"Q: {q.strip()}" + (f"\nA: {a.strip()}" if a.strip() else "") for q, a in related]
        sections.append("People Also Ask:\n" + "\n".join(entries))
    if not sections:
        return f"No results returned for query: {result.query}"
    return "\n\n---\n\n".join(sections)


def format_results(blocks: list[tuple[str, str]]) -> str:
    """Several queries' formatted results, each under its query."""
    separator = "\n\n" + "-" * 40 + "\n\n"
    return separator.join(f"Results for query `{query}`:\n\n{text}" for query, text in blocks)


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ("" if value is None else str(value).strip())


def parse_serper(query: str, data: Any) -> SearchResult:
    """A Serper ``/search`` reply as a :class:`SearchResult`; BackendError if it is not an object."""
    if not isinstance(data, dict):
        raise BackendError(f"search reply is {type(data).__name__}, not a JSON object")
    hits = [
        SearchHit(_text(item.get("title")), _text(item.get("link")), _text(item.get("snippet")))
        for item in data.get("organic") or []
        if isinstance(item, dict)
    ]
    knowledge: list[str] = []
    graph = data.get("knowledgeGraph") or {}
    if isinstance(graph, dict):
        if _text(graph.get("title")):
            knowledge.append(f"Knowledge Graph: {_text(graph.get('title'))}")
        if _text(graph.get("description")):
            knowledge.append(_text(graph.get("description")))
        attributes = graph.get("attributes") or {}
        if isinstance(attributes, dict):
            knowledge += [f"{k}: {_text(v)}" for k, v in attributes.items() if _text(v)]
    related = [
        (_text(item.get("question")), _text(item.get("snippet")))
        for item in data.get("peopleAlsoAsk") or []
        if isinstance(item, dict)
    ]
    return SearchResult(query=query, hits=hits, knowledge=knowledge, related=related)


def _retryable(status: int) -> bool:
    return status == 429 or status >= 500


class SerperSearch:
    """Google results through the Serper API (``POST {"q": query}``, ``X-API-KEY`` header)."""

    def __init__(self, api_key: str, url: str = SERPER_API_URL, timeout: float = 15.0, max_retries: int = 2) -> None:
        if not api_key:
            raise ValueError("SerperSearch needs an API key")
        self.api_key = api_key
        self.url = url
        self.timeout = timeout
        self.max_retries = max_retries
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_lock": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def client(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(timeout=self.timeout)
            return self._client

    def search(self, query: str, num_results: int) -> SearchResult:
        headers = {"X-API-KEY": self.api_key, "Content-Type": "application/json"}
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(min(0.5 * 2 ** (attempt - 1), 4.0))
            try:
                response = self.client().post(self.url, headers=headers, json={"q": query})
            except httpx.HTTPError as exc:
                last = f"search request failed: {type(exc).__name__}: {exc}"
                continue
            if response.status_code >= 400:
                last = f"search API error {response.status_code}: {response.text.strip()[:300]}"
                if _retryable(response.status_code):
                    continue
                raise BackendError(last)
            try:
                data = response.json()
            except ValueError as exc:
                raise BackendError(f"search reply is not JSON: {exc}") from exc
            return parse_serper(query, data)
        raise BackendError(last)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
