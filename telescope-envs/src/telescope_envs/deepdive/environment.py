"""deepdive: a multi-turn web-research agent graded by a judge model.

The model answers a hard factual question by researching it with four tools,
called as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``:

- ``search_web(queries, num_results_per_query=3)``: up to 10 queries at once; each
  gives ranked results (title, url, snippet) from the search backend;
- ``scan_page(url, pattern="", context_lines=0, max_matches=200)``: a page's size
  and the lines matching a case-insensitive regex (``L<n>: text``), with context;
- ``open_lines(url, lines=None)``: the whole page, or the given 0-based inclusive
  line ranges (``[start, end]`` or ``[[start, end], ...]``);
- ``finish(final_answer)``: ends the rollout with the final answer. With
  ``finish_with_tool=False`` there is no ``finish``: the answer is the ``\\boxed{}``
  of a reply (or a reply without a tool call), as upstream.

A reply without a tool call also ends the rollout (its text is the answer), and
so does ``max_turns`` (upstream default 32). Tool outputs are cut to
``max_response_chars``. The system prompt lists the tools as JSON schemas
(``tool_prompt="schemas"``), or one line each (``"compact"``: a third of the
tokens, for tiny models with short contexts), or not at all (``"none"``: the system
prompt is one sentence, for a tiny model that learns the calls from the warm start's
demonstrations).

Reward: the judge's verdict (1.0 correct, 0.0 otherwise) minus
``redundancy_penalty_weight`` times the mean pairwise Jaccard similarity of the
rollout's search queries (0 by default), as upstream. No answer scores 0 without a
judge call. Sample metrics: ``judge_reward``, ``judge_unparsed``, ``judge_error``,
``backend_failures``, ``finished`` (ended by ``finish``), ``has_answer``,
``search_web_mean_queries``, ``query_redundancy`` and the tool counts of
:meth:`~telescope.api.tools.ToolEnvironment.get_tool_metrics`.

Failures are contained and counted. A search backend failure is shown to the
model as a tool error and the rollout goes on; a judge failure, or any search
failure during the rollout, sets ``RewardResult.error``: the sample is counted as
errored and left out of training (upstream scores it 0), and the run goes on.
A page that cannot be read is content (the model sees the error), not a failure.

Backends (pluggable: a name in the config, or an object in Python):

- ``search_backend``: ``"serper"`` (default, upstream's: Google via the Serper
  API, key from the ``serper_api_key_var`` environment variable, ``search_url`` to
  redirect) or ``"local"`` (BM25 over ``corpus``); or any
  :class:`~telescope_envs.deepdive.search.SearchBackend`;
- ``page_backend``: ``"http"`` (default) or ``"local"`` (the ``corpus`` documents);
  or any :class:`~telescope_envs.deepdive.pages.PageBackend`;
- ``judge_backend``: ``"model"`` (default: ``judge_model`` at ``judge_base_url``,
  OpenAI when unset, key from ``judge_api_key_var``; ``judge_api`` ``"chat"`` or
  ``"completions"``, which reaches Telescope's embedded engine) or ``"match"``
  (the normalised reference appears in the answer; no model); or any
  :class:`~telescope_envs.deepdive.judge.Judge`.

Data: ``dataset_name`` (default ``zai-org/DeepDive``, split ``qa_rl``, columns
``question`` and ``answer``) split like upstream into train and held-out parts
(``dataset_test_size``, ``dataset_seed``: the same permutation as
``datasets.Dataset.train_test_split``; ``use_held_out`` picks the held-out part,
upstream's ``eval=True``), or ``"builtin"``: twelve questions about a small
invented archipelago, answerable from the builtin ``corpus`` (offline runs).
Demonstration (warm start): a ``search_web`` call with the question as the query
(the call format, not the answer); with ``demonstrate_answer`` the demonstration goes
on, after the search's results, to the reference answer (a ``finish`` call, or a
``\\boxed{}`` reply without the finish tool): for a world whose answers one search
finds, such as the CPU example's invented islands, it teaches reading them off the
results, and the held-out questions measure whether that carries to unseen ones.

Everything about one rollout lives in its ``RolloutState``; the backends are
shared, thread-safe and hold only caches and HTTP clients (not pickled).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from telescope.api.environment import RolloutState
from telescope.api.events import timed
from telescope.api.records import Message, RewardResult, Sample
from telescope.api.tools import MALFORMED, ToolCall, ToolEnvironment
from telescope_envs._data import load_rows, stable_id, unique_ids
from telescope_envs.deepdive.corpus import BUILTIN, DATA_DIR, Corpus, LocalPages, LocalSearch
from telescope_envs.deepdive.judge import Judge, MatchJudge, ModelJudge, strip_think
from telescope_envs.deepdive.lines import normalize_line_ranges, render_line_ranges, scan_block, truncate
from telescope_envs.deepdive.pages import HttpPages, PageBackend
from telescope_envs.deepdive.search import (
    MAX_QUERIES,
    SERPER_API_URL,
    BackendError,
    SearchBackend,
    SerperSearch,
    format_result,
    format_results,
)

DEFAULT_DATASET = "zai-org/DeepDive"
DEFAULT_SPLIT = "qa_rl"
METADATA_KEYS = ("source", "category", "difficulty", "context", "metadata")
PROMPT_SUFFIX = "\nReason step by step using the given tools and provide the final answer in \\boxed{}."
OPENAI_BASE_URL = "https://api.openai.com/v1"
_TOOL_BLOCK_RE = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.DOTALL)
_WORD_RE = re.compile(r"\w+")


def boxed(text: str) -> str | None:
    """The content of the first ``\\boxed{...}`` (nested braces allowed), or None."""
    start = text.find("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[start + len("\\boxed{") : i - 1].strip() if depth == 0 else None


def query_redundancy(queries: list[str]) -> float:
    """Mean pairwise Jaccard similarity of the queries' word sets (0 with fewer than two)."""
    sets = [s for s in ({w.lower() for w in _WORD_RE.findall(q)} for q in queries) if s]
    pairs = [(a, b) for i, a in enumerate(sets) for b in sets[i + 1 :]]
    return sum(len(a & b) / len(a | b) for a, b in pairs) / len(pairs) if pairs else 0.0


def held_out_split(n: int, test_size: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, test) row indices, as ``datasets.Dataset.train_test_split(test_size, seed=seed)`` picks them."""
    import numpy as np

    if test_size <= 0:
        return list(range(n)), []
    n_test = math.ceil(test_size * n) if test_size < 1 else int(test_size)
    permutation = np.random.default_rng(seed).permutation(n)
    return [int(i) for i in permutation[n_test:]], [int(i) for i in permutation[:n_test]]


class DeepDiveEnvironment(ToolEnvironment):
    """Research a question with search and page tools; a judge grades the final answer."""

    name: ClassVar[str] = "deepdive"
    data_files: ClassVar[dict[str, tuple[str, ...]]] = {"dataset_name": ()}  # column names vary by source
    #: Hard cap of the ``max_turns`` keyword argument.
    max_turns: ClassVar[int] = 64
    reward_min: ClassVar[float] = 0.0
    reward_max: ClassVar[float] = 1.0
    metrics_ranges: ClassVar[dict[str, dict[str, float]]] = {
        "judge_reward": {"min": 0.0, "max": 1.0},
        "judge_unparsed": {"min": 0.0, "max": 1.0},
        "judge_error": {"min": 0.0, "max": 1.0},
        "finished": {"min": 0.0, "max": 1.0},
        "has_answer": {"min": 0.0, "max": 1.0},
        "query_redundancy": {"min": 0.0, "max": 1.0},
        "search_web_mean_queries": {"min": 0.0, "max": float(MAX_QUERIES)},
        "tool_success_rate": {"min": 0.0, "max": 1.0},
    }

    def __init__(
        self,
        dataset_name: str = DEFAULT_DATASET,
        dataset_split: str = DEFAULT_SPLIT,
        dataset_test_size: float = 0.1,
        dataset_seed: int = 2025,
        use_held_out: bool = False,
        max_samples: int | None = None,
        max_turns: int = 32,
        finish_with_tool: bool = True,
        strip_think_tags: bool = True,
        tool_call_format: str = "xml",
        tool_prompt: str = "schemas",
        max_search_results: int = 10,
        max_response_chars: int = 20_000,
        redundancy_penalty_weight: float = 0.0,
        search_backend: str | SearchBackend = "serper",
        serper_api_key_var: str = "SERPER_API_KEY",
        search_url: str = SERPER_API_URL,
        serper_timeout: float = 15.0,
        corpus: str = BUILTIN,
        page_backend: str | PageBackend = "http",
        page_timeout: float = 30.0,
        page_cache_size: int = 256,
        judge_backend: str | Judge = "model",
        judge_model: str | None = "gpt-4.1-mini",
        judge_base_url: str | None = None,
        judge_api_key_var: str | None = "OPENAI_API_KEY",
        judge_api: str = "chat",
        judge_timeout: float = 120.0,
        judge_max_tokens: int = 10,
        max_retries: int = 2,
        demonstrate_answer: bool = False,
    ) -> None:
        """Build the backends; a named backend that cannot work (a missing API key) raises here."""
        if tool_call_format != "xml":
            raise ValueError(f"deepdive tool_call_format must be 'xml' (<tool_call> JSON), not {tool_call_format!r}")
        if tool_prompt not in ("schemas", "compact", "none"):
            raise ValueError(f"deepdive tool_prompt must be 'schemas', 'compact' or 'none', not {tool_prompt!r}")
        if not 1 <= max_turns <= self.max_turns:
            raise ValueError(f"deepdive max_turns must be between 1 and {self.max_turns}, got {max_turns}")
        tools: list[Callable[..., Any]] = [self.search_web, self.scan_page, self.open_lines]
        super().__init__(tools=[*tools, self.finish] if finish_with_tool else tools)
        self.dataset_name = dataset_name
        self.dataset_split = dataset_split
        self.dataset_test_size = dataset_test_size
        self.dataset_seed = dataset_seed
        self.use_held_out = use_held_out
        self.max_samples = max_samples
        self.turn_limit = max_turns
        self.finish_with_tool = finish_with_tool
        self.tool_prompt = tool_prompt
        self.strip_think_tags = strip_think_tags
        self.max_search_results = max(1, max_search_results)
        self.max_response_chars = max(1, int(max_response_chars))
        self.redundancy_penalty_weight = redundancy_penalty_weight
        self.demonstrate_answer = demonstrate_answer
        shared = Corpus(corpus)  # loaded on first use, by whichever local backend needs it
        self.search = self._search_backend(
            search_backend, serper_api_key_var, search_url, serper_timeout, shared, max_retries
        )
        self.pages = self._page_backend(page_backend, page_timeout, page_cache_size, shared)
        self.judge = self._judge_backend(
            judge_backend,
            judge_model,
            judge_base_url,
            judge_api_key_var,
            judge_api,
            judge_timeout,
            judge_max_tokens,
            max_retries,
        )

    # -------------------------------------------------------------- backends
    @staticmethod
    def _search_backend(
        spec: str | SearchBackend, key_var: str, url: str, timeout: float, corpus: Corpus, retries: int
    ) -> SearchBackend:
        if not isinstance(spec, str):
            return spec
        if spec == "local":
            return LocalSearch(corpus)
        if spec == "serper":
            key = os.environ.get(key_var, "")
            if not key:
                raise ValueError(
                    f"deepdive search_backend='serper' needs a Serper API key in ${key_var} "
                    "(or search_backend: local for the offline corpus)"
                )
            return SerperSearch(key, url=url, timeout=timeout, max_retries=retries)
        raise ValueError(f"deepdive search_backend must be 'serper' or 'local', not {spec!r}")

    @staticmethod
    def _page_backend(spec: str | PageBackend, timeout: float, cache_size: int, corpus: Corpus) -> PageBackend:
        if not isinstance(spec, str):
            return spec
        if spec == "local":
            return LocalPages(corpus)
        if spec == "http":
            return HttpPages(timeout=timeout, cache_size=cache_size)
        raise ValueError(f"deepdive page_backend must be 'http' or 'local', not {spec!r}")

    @staticmethod
    def _judge_backend(
        spec: str | Judge,
        model: str | None,
        base_url: str | None,
        key_var: str | None,
        api: str,
        timeout: float,
        max_tokens: int,
        retries: int,
    ) -> Judge:
        if not isinstance(spec, str):
            return spec
        if spec == "match":
            return MatchJudge()
        if spec != "model":
            raise ValueError(f"deepdive judge_backend must be 'model' or 'match', not {spec!r}")
        if api not in ("chat", "completions"):
            raise ValueError(f"deepdive judge_api must be 'chat' or 'completions', not {api!r}")
        key = os.environ.get(key_var) if key_var else None
        if base_url is None and not key:
            raise ValueError(
                f"deepdive judge_backend='model' without judge_base_url calls OpenAI and needs a key in ${key_var} "
                "(or set judge_base_url to an OpenAI-compatible server, or judge_backend: match)"
            )
        return ModelJudge(
            base_url or OPENAI_BASE_URL,
            model,
            api_key=key,
            api="chat" if api == "chat" else "completions",
            max_tokens=max_tokens,
            timeout=timeout,
            max_retries=retries,
        )

    def close(self) -> None:
        """Close the backends' HTTP clients (they reopen on next use)."""
        for backend in (self.search, self.pages, self.judge):
            close = getattr(backend, "close", None)
            if callable(close):
                close()

    # ----------------------------------------------------------------- tools
    def search_web(self, queries: list[str], num_results_per_query: int = 3) -> str:
        """Search the web with up to 10 queries at once; queries beyond 10 are ignored.

        Args:
            queries: the search queries (a list of strings)
            num_results_per_query: how many results to show for each query
        """
        if isinstance(queries, str):
            queries = [queries]
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise ValueError("`queries` must be a list of strings")
        queries = [q.strip() for q in queries if q.strip()][:MAX_QUERIES]
        if not queries:
            return "No queries given."
        limit = max(1, min(int(num_results_per_query), self.max_search_results))

        def one(query: str) -> str:
            return truncate(format_result(self.search.search(query, limit), limit), self.max_response_chars)

        if len(queries) == 1:
            texts = [one(queries[0])]
        else:
            with ThreadPoolExecutor(max_workers=len(queries)) as pool:
                texts = list(pool.map(one, queries))
        return format_results(list(zip(queries, texts, strict=True)))

    def scan_page(self, url: str, pattern: str = "", context_lines: int = 0, max_matches: int = 200) -> str:
        """Get a page's size and the lines matching a pattern; good to use before open_lines.

        Args:
            url: the page to inspect
            pattern: a regular expression matched against each line (case-insensitive); empty for none
            context_lines: extra lines to show around each match
            max_matches: the most matching lines to return
        """
        page = self.pages.open(str(url))
        block = scan_block(
            page.url, page.content, page.error, page.page_format, pattern or None, int(context_lines), int(max_matches)
        )
        return truncate(block, self.max_response_chars)

    def open_lines(self, url: str, lines: list[list[int]] | None = None) -> str:
        """Get a page's text, whole or in line ranges.

        Args:
            url: the page to open
            lines: optional 0-based inclusive line ranges, [[start, end], ...] or one [start, end]
        """
        page = self.pages.open(str(url))
        ranges = normalize_line_ranges(lines) if lines is not None else []
        if page.error is not None or page.content is None:
            text = page.error or "error"
            out = "\n".join([text, *(f"L{a}..{b}: (no content)" for a, b in ranges)])
        elif lines is None:
            out = page.content or "(no content)"
        elif not ranges:
            out = "(no content)"
        else:
            out = render_line_ranges(page.content, ranges)
        return truncate(out, self.max_response_chars)

    def finish(self, final_answer: str) -> str:
        """Give the final answer to the question; this ends the research.

        Args:
            final_answer: the answer, as short as possible
        """
        return final_answer

    # ------------------------------------------------------------------ data
    def load_dataset(self) -> list[Sample]:
        path = str(DATA_DIR / "questions.jsonl") if self.dataset_name == BUILTIN else self.dataset_name
        rows = load_rows(path, "train" if self.dataset_name == BUILTIN else self.dataset_split)
        train, test = held_out_split(len(rows), self.dataset_test_size, self.dataset_seed)
        picked = [rows[i] for i in (test if self.use_held_out else train)]
        if self.max_samples is not None:
            picked = picked[: self.max_samples]
        items = []
        for row in picked:
            question, answer = str(row.get("question") or "").rstrip(), str(row.get("answer") or "").rstrip()
            if question and answer:
                metadata = {"raw_question": question, **{k: row[k] for k in METADATA_KEYS if row.get(k) is not None}}
                items.append((question, answer, metadata))
        if not items:
            raise ValueError(
                f"deepdive: no question/answer rows in {self.dataset_name!r} (held-out={self.use_held_out})"
            )
        ids = unique_ids([stable_id(self.name, q, a) for q, a, _ in items])
        return [
            Sample(
                prompt=q if self.finish_with_tool else q + PROMPT_SUFFIX,
                answer=a,
                sample_id=sid,
                environment=self.name,
                metadata=meta,
            )
            for sid, (q, a, meta) in zip(ids, items, strict=True)
        ]

    def tools_text(self) -> str:
        """The tools as the system prompt shows them: JSON schemas, or one short line each (``"compact"``)."""
        if self.tool_prompt == "schemas":
            return "\n".join(json.dumps(schema) for schema in self.tool_schemas)
        lines = []
        for name, func in self._tools.items():
            params = inspect.signature(func).parameters.values()
            shown = ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in params)
            lines.append(f"{name}({shown}): {(inspect.getdoc(func) or '').splitlines()[0]}")
        return "\n".join(lines)

    def format_prompt(self, sample: Sample) -> list[Message]:
        if self.tool_prompt == "none":
            system = "Answer the question by searching the web."
            return [{"role": "system", "content": system}, {"role": "user", "content": str(sample.prompt)}]
        schemas = self.tools_text()
        ending = (
            "When you know the answer, call finish with it."
            if self.finish_with_tool
            else "When you know the answer, reply without a tool call and give it in \\boxed{}."
        )
        system = (
            "You are a research agent. Answer the question by searching the web and reading pages with these tools:\n"
            f"{schemas}\n"
            'Call a tool with <tool_call>{"name": <tool name>, "arguments": {...}}</tool_call>; '
            f"one reply may hold several calls. {ending}"
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": str(sample.prompt)}]

    def demonstration(self, sample: Sample) -> str | None:
        """A first research step: ``search_web`` with the question as the query (teaches the call, not the answer)."""
        question = str(sample.metadata.get("raw_question") or sample.prompt)
        return f"<tool_call>{json.dumps({'name': 'search_web', 'arguments': {'queries': [question]}})}</tool_call>"

    def demonstration_turns(self, sample: Sample) -> list[str] | None:
        """With ``demonstrate_answer``: the search, then the reference answer (see the module docstring)."""
        if not self.demonstrate_answer:
            return None
        first = self.demonstration(sample)
        if first is None:
            return None
        if self.finish_with_tool:
            call = {"name": "finish", "arguments": {"final_answer": str(sample.answer)}}
            return [first, f"<tool_call>{json.dumps(call)}</tool_call>"]
        return [first, f"The answer is \\boxed{{{sample.answer}}}."]

    # ---------------------------------------------------------------- rollout
    @staticmethod
    def _finish_answer(call: ToolCall) -> str | None:
        answer = call.arguments.get("final_answer")
        if (
            call.error
            or call.name != "finish"
            or not isinstance(answer, str)
            or set(call.arguments) != {"final_answer"}
        ):
            return None
        return answer

    def is_done(self, messages: list[Message], state: RolloutState) -> bool:
        """Done on a valid ``finish`` call, a ``\\boxed{}`` answer (no finish tool), no tool call, or max_turns."""
        calls = self._last_calls(messages)
        if self.finish_with_tool:
            for call in calls:
                answer = self._finish_answer(call)
                if answer is not None:
                    if state.data.get("finish_turn") != state.turn:  # record once, however often asked
                        state.data["finish_turn"] = state.turn
                        state.data["final_answer"] = answer
                        state.data.setdefault("tool_calls", []).append(("finish", True))
                    return True
        elif messages and messages[-1].get("role") == "assistant" and boxed(str(messages[-1].get("content", ""))):
            return True
        return state.turn >= self.turn_limit or not calls

    def env_response(self, messages: list[Message], state: RolloutState) -> list[Message]:
        log: list[tuple[str, bool]] = state.data.setdefault("tool_calls", [])
        replies: list[Message] = []
        for call in self._last_calls(messages):
            ok, text = self._execute(call, state)
            log.append((call.name or MALFORMED, ok))
            replies.append({"role": self.tool_message_role, "content": truncate(text, self.max_response_chars)})
        return replies

    def _execute(self, call: ToolCall, state: RolloutState) -> tuple[bool, str]:
        """Run one call; a BackendError is counted in the rollout's ``backend_failures``."""
        if self.refusal(call) is not None:
            return self.call_tool(call)  # the base class words the error for the model and records the call
        func = self._tools[call.name]
        if call.name == "search_web":
            queries = call.arguments.get("queries")
            queries = [queries] if isinstance(queries, str) else queries
            if isinstance(queries, list):
                state.data.setdefault("search_queries", []).append([q for q in queries if isinstance(q, str)])
        with timed("tool.call", tool=call.name) as event:
            try:
                result = func(**call.arguments)
            except BackendError as exc:  # the service failed: counted; the sample will be errored
                event.update(ok=False, error=f"BackendError: {exc}")
                state.data["backend_failures"] = int(state.data.get("backend_failures", 0)) + 1
                state.data["backend_failure"] = f"{call.name}: {exc}"
                return False, f"Error: {call.name} failed: {exc}"
            except Exception as exc:  # bad arguments and the like: the model sees it and may recover
                event.update(ok=False, error=f"{type(exc).__name__}: {exc}")
                return False, f"Error: {call.name} raised {type(exc).__name__}: {exc}"
            event["ok"] = True
        return True, str(result)

    def final_answer(self, messages: list[Message], state: RolloutState) -> str:
        """The ``finish`` answer, else the ``\\boxed{}`` or text (tool calls removed) of the last reply."""
        answer = state.data.get("final_answer")
        if answer is None:
            last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
            text = str(last.get("content", "")) if last else ""
            answer = boxed(text) if not self.finish_with_tool else None
            if answer is None:
                answer = _TOOL_BLOCK_RE.sub("", text)
        return (strip_think(answer) if self.strip_think_tags else answer).strip()

    # ----------------------------------------------------------------- reward
    def compute_reward(self, messages: list[Message], sample: Sample, state: RolloutState) -> RewardResult:
        metrics = {key: float(value) for key, value in self.get_tool_metrics(state).items()}
        per_call: list[list[str]] = state.data.get("search_queries", [])
        queries = [q for call in per_call for q in call[:MAX_QUERIES]]
        redundancy = query_redundancy(queries)
        failures = int(state.data.get("backend_failures", 0))
        answer = self.final_answer(messages, state)
        mean_queries = sum(min(len(c), MAX_QUERIES) for c in per_call) / len(per_call) if per_call else 0.0
        metrics.update(
            search_web_mean_queries=mean_queries,
            query_redundancy=redundancy,
            backend_failures=float(failures),
            finished=float("final_answer" in state.data),
            has_answer=float(bool(answer)),
            judge_reward=0.0,
            judge_unparsed=0.0,
            judge_error=0.0,
        )
        error: str | None = None
        if failures:
            error = f"{failures} backend failure(s) during the rollout, the last: {state.data.get('backend_failure')}"
        elif answer:
            question = str(sample.metadata.get("raw_question") or sample.prompt)
            try:
                verdict = self.judge.judge(question, str(sample.answer), answer)
            except Exception as exc:  # contained: the sample is errored, the run goes on
                metrics["judge_error"] = 1.0
                error = f"judge failed: {type(exc).__name__}: {exc}"
            else:
                metrics["judge_reward"] = float(verdict.correct is True)
                metrics["judge_unparsed"] = float(verdict.correct is None)
        total = metrics["judge_reward"] - self.redundancy_penalty_weight * redundancy
        return RewardResult(total_reward=float(total), sample_metrics=metrics, error=error)
