"""A local corpus: offline search (BM25) and pages for deepdive, no network.

A corpus is a JSONL file of documents ``{"url", "title", "text"}`` (``id`` may
stand in for ``url``), or a folder of ``.txt`` / ``.md`` files (url
``corpus://<relative path>``, title the first non-empty line). ``"builtin"`` is the
small corpus shipped with the package (``data/corpus.jsonl``), which the builtin
questions (``data/questions.jsonl``) are answerable from.

:class:`LocalSearch` ranks documents with Okapi BM25 (``k1=1.5``, ``b=0.75``) over
lower-cased ``\\w+`` terms; a hit's snippet is the document line sharing most terms
with the query. :class:`LocalPages` serves a document's text by its url. Both are
read-only after construction (the index is built once, lazily, under a lock), so
one instance serves every rollout.

Limits: the whole corpus is held in memory and scored exhaustively per query:
meant for thousands of documents, not millions.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telescope_envs.deepdive.pages import Page
from telescope_envs.deepdive.search import SearchHit, SearchResult

DATA_DIR = Path(__file__).parent / "data"
BUILTIN = "builtin"
_TERM_RE = re.compile(r"\w+")


def terms(text: str) -> list[str]:
    return [t.lower() for t in _TERM_RE.findall(text)]


@dataclass(frozen=True)
class Document:
    url: str
    title: str
    text: str


def load_documents(path: str) -> list[Document]:
    """The documents of a JSONL file or a folder of text files (``"builtin"``: the shipped corpus)."""
    source = DATA_DIR / "corpus.jsonl" if path == BUILTIN else Path(path)
    if source.is_dir():
        docs = []
        for file in sorted(p for p in source.rglob("*") if p.suffix in (".txt", ".md") and p.is_file()):
            text = file.read_text(encoding="utf-8")
            title = next((line.strip("# ").strip() for line in text.splitlines() if line.strip()), file.stem)
            docs.append(Document(f"corpus://{file.relative_to(source).as_posix()}", title, text))
        return docs
    if not source.is_file():
        raise FileNotFoundError(f"deepdive corpus {path!r} is neither a JSONL file nor a folder")
    docs = []
    with source.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            row: dict[str, Any] = json.loads(line)
            url = row.get("url") or row.get("id")
            if not url or "text" not in row:
                raise ValueError(f"{source}:{number}: a corpus row needs 'url' (or 'id') and 'text'")
            docs.append(Document(str(url), str(row.get("title") or url), str(row["text"])))
    return docs


class Corpus:
    """Documents by url and a BM25 index over them, built on first use."""

    def __init__(self, path: str = BUILTIN, k1: float = 1.5, b: float = 0.75) -> None:
        self.path = path
        self.k1 = k1
        self.b = b
        self._lock = threading.Lock()
        self._docs: list[Document] | None = None
        self._by_url: dict[str, Document] = {}
        self._tf: list[Counter[str]] = []
        self._df: Counter[str] = Counter()
        self._avg_len = 0.0

    def __getstate__(self) -> dict[str, Any]:  # the index is rebuilt where it is used
        return {"path": self.path, "k1": self.k1, "b": self.b}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def documents(self) -> list[Document]:
        with self._lock:
            if self._docs is None:
                docs = load_documents(self.path)
                self._tf = [Counter(terms(f"{d.title}\n{d.text}")) for d in docs]
                for tf in self._tf:
                    self._df.update(tf.keys())
                self._avg_len = sum(sum(tf.values()) for tf in self._tf) / max(len(docs), 1)
                self._by_url = {d.url: d for d in docs}
                self._docs = docs
            return self._docs

    def get(self, url: str) -> Document | None:
        self.documents()
        return self._by_url.get(url.strip())

    def rank(self, query: str, limit: int) -> list[tuple[float, Document]]:
        """The ``limit`` best documents for ``query`` with their BM25 scores (score > 0 only)."""
        docs = self.documents()
        n = len(docs)
        scored: list[tuple[float, int]] = []
        query_terms = set(terms(query))
        for i, tf in enumerate(self._tf):
            length = sum(tf.values())
            score = 0.0
            for term in query_terms:
                freq = tf.get(term, 0)
                if not freq:
                    continue
                idf = math.log(1 + (n - self._df[term] + 0.5) / (self._df[term] + 0.5))
                score += idf * freq * (self.k1 + 1) / (freq + self.k1 * (1 - self.b + self.b * length / self._avg_len))
            if score > 0:
                scored.append((score, i))
        scored.sort(key=lambda item: (-item[0], item[1]))
        return [(score, docs[i]) for score, i in scored[:limit]]


def snippet(doc: Document, query: str, max_chars: int = 240) -> str:
    """The document line sharing most terms with the query (the first line on a tie)."""
    wanted = set(terms(query))
    lines = [line.strip() for line in doc.text.splitlines() if line.strip()]
    if not lines:
        return ""
    best = max(lines, key=lambda line: len(wanted & set(terms(line))))
    return best if len(best) <= max_chars else best[: max_chars - 3] + "..."


class LocalSearch:
    """BM25 search over a :class:`Corpus`: offline, deterministic, never fails once loaded."""

    def __init__(self, corpus: Corpus) -> None:
        self.corpus = corpus

    def search(self, query: str, num_results: int) -> SearchResult:
        ranked = self.corpus.rank(query, max(1, num_results))
        return SearchResult(query=query, hits=[SearchHit(d.title, d.url, snippet(d, query)) for _, d in ranked])


class LocalPages:
    """Pages from a :class:`Corpus` by url; an unknown url is a page error, as a 404 would be."""

    def __init__(self, corpus: Corpus) -> None:
        self.corpus = corpus

    def open(self, url: str) -> Page:
        doc = self.corpus.get(url)
        if doc is None:
            return Page(url=url, content=None, page_format="error", error=f"Error fetching {url}: not in the corpus")
        return Page(url=url, content=doc.text, page_format="text")
