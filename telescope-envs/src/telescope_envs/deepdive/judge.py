"""Judges for deepdive's reward: a model behind an OpenAI-compatible endpoint, or a string match.

A judge reads the question, the reference answer and the agent's final answer and
returns a :class:`Verdict`: correct, incorrect, or unparsed (the judge replied but
said neither). A failure of the service (network, HTTP status, a malformed reply)
raises :class:`~telescope_envs.deepdive.search.BackendError`; the environment
counts it and marks the sample as errored, so a broken judge never trains the
policy on made-up zeros.

:class:`ModelJudge` sends the upstream's judge prompt (:data:`JUDGE_PROMPT`, which
asks for "yes" or "no") to ``<base_url>/chat/completions`` (``api="chat"``: OpenAI,
vLLM's ``serve``, most providers) or ``<base_url>/completions`` (``api="completions"``,
the prompt as plain text: any completions server, Telescope's embedded engine
included), greedy (``temperature`` 0) with a few ``max_tokens``; retries
``max_retries`` times on a connection error, 429 or 5xx. The verdict is the first
"yes"/"correct" or "no"/"incorrect" word of the reply after any ``<think>`` block
(the upstream counts any "yes" substring, so "no, yes-men..." passes there and
not here). :class:`MatchJudge` needs no model: correct when the normalised
reference (lower case, no punctuation or articles) appears in the normalised
answer; for offline runs and tests.
"""

from __future__ import annotations

import re
import string
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import httpx

from telescope_envs.deepdive.search import BackendError

JUDGE_PROMPT = """\
You are a helpful judge. Given a question and a reference answer, determine \
if the given response correctly answers the question. The response does not \
need to match the reference answer exactly, but it should contain the correct \
information.

Question: {question}
Reference Answer: {answer}
Response: {completion}

Does the response correctly answer the question? Reply with only "yes" or "no"."""

_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_VERDICT_RE = re.compile(r"\b(yes|no|correct|incorrect)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Verdict:
    """``correct`` is None when the judge's reply held no verdict; ``raw`` is the reply."""

    correct: bool | None
    raw: str = ""


@runtime_checkable
class Judge(Protocol):
    """Grades one answer; thread-safe; raises BackendError when the judge cannot be reached."""

    def judge(self, question: str, reference: str, response: str) -> Verdict: ...


def strip_think(text: str) -> str:
    """``text`` without ``<think>...</think>`` blocks (and anything before a dangling ``</think>``)."""
    text = _THINK_RE.sub("", text)
    if "</think>" in text.lower():
        text = text[text.lower().rindex("</think>") + len("</think>") :]
    return text.strip()


def parse_verdict(reply: str) -> bool | None:
    """True for a first verdict word "yes"/"correct", False for "no"/"incorrect", None for neither."""
    match = _VERDICT_RE.search(strip_think(reply))
    if match is None:
        return None
    return match.group(1).lower() in ("yes", "correct")


def normalize_answer(text: str) -> str:
    """Lower case, punctuation and the articles a/an/the removed, blanks squeezed."""
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


class MatchJudge:
    """Correct when the normalised reference appears in the normalised answer (no model, never fails)."""

    def judge(self, question: str, reference: str, response: str) -> Verdict:
        ref, got = normalize_answer(reference), normalize_answer(response)
        correct = bool(ref) and f" {ref} " in f" {got} "
        return Verdict(correct=correct, raw="yes" if correct else "no")


class ModelJudge:
    """A judge model behind an OpenAI-compatible chat or completions endpoint."""

    def __init__(
        self,
        base_url: str,
        model: str | None,
        api_key: str | None = None,
        api: Literal["chat", "completions"] = "chat",
        max_tokens: int = 10,
        timeout: float = 120.0,
        max_retries: int = 2,
        max_response_chars: int = 4000,
        prompt_template: str = JUDGE_PROMPT,
    ) -> None:
        if api not in ("chat", "completions"):
            raise ValueError(f"judge api must be 'chat' or 'completions', not {api!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.api = api
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_response_chars = max_response_chars
        self.prompt_template = prompt_template
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
                headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
                self._client = httpx.Client(base_url=self.base_url, timeout=self.timeout, headers=headers)
            return self._client

    def prompt(self, question: str, reference: str, response: str) -> str:
        response = response[: self.max_response_chars]
        return self.prompt_template.format(question=question, answer=reference, completion=response)

    def request(self, prompt: str) -> tuple[str, dict[str, Any]]:
        """The route and JSON body of one judge request."""
        body: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": 0.0}
        if self.model is not None:
            body["model"] = self.model
        if self.api == "chat":
            return "/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}
        return "/completions", {**body, "prompt": prompt}

    def reply_text(self, data: Any) -> str:
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"] if self.api == "chat" else choice["text"]
        except (KeyError, IndexError, TypeError) as exc:
            field = "message.content" if self.api == "chat" else "text"
            raise BackendError(f"judge reply has no choices[0].{field}") from exc
        return "" if text is None else str(text)

    def judge(self, question: str, reference: str, response: str) -> Verdict:
        route, body = self.request(self.prompt(question, reference, response))
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(min(0.5 * 2 ** (attempt - 1), 4.0))
            try:
                reply = self.client().post(route, json=body)
            except httpx.HTTPError as exc:
                last = f"judge request failed: {type(exc).__name__}: {exc}"
                continue
            if reply.status_code >= 400:
                last = f"judge error {reply.status_code}: {reply.text.strip()[:300]}"
                if reply.status_code == 429 or reply.status_code >= 500:
                    continue
                raise BackendError(last)
            try:
                data = reply.json()
            except ValueError as exc:
                raise BackendError(f"judge reply is not JSON: {exc}") from exc
            text = self.reply_text(data)
            return Verdict(correct=parse_verdict(text), raw=text)
        raise BackendError(last)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
