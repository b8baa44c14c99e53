"""deepdive's backends: Serper search over HTTP, HTTP pages, the local corpus, line tools, judges."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from http_fakes import FakeHTTP, Request

from telescope_envs.deepdive.corpus import Corpus, LocalPages, LocalSearch, load_documents
from telescope_envs.deepdive.judge import MatchJudge, ModelJudge, parse_verdict, strip_think
from telescope_envs.deepdive.lines import normalize_line_ranges, render_line_ranges, scan_block, truncate
from telescope_envs.deepdive.pages import HttpPages, html_to_text
from telescope_envs.deepdive.search import BackendError, SerperSearch, format_result

SERPER_REPLY = {
    "searchParameters": {"q": "amsel light", "type": "search"},
    "knowledgeGraph": {"title": "Amsel Light", "description": "A lighthouse.", "attributes": {"Built": "1834"}},
    "organic": [
        {
            "title": "Amsel Light - Wiki",
            "link": "https://example.org/amsel",
            "snippet": "Built in 1834.",
            "position": 1,
        },
        {"title": "Port Amsel", "link": "https://example.org/port", "snippet": "The capital.", "position": 2},
        {"title": "Third", "link": "https://example.org/3", "position": 3},
    ],
    "peopleAlsoAsk": [{"question": "Who built Amsel Light?", "snippet": "Tomas Reyl.", "title": "t", "link": "l"}],
}


# ------------------------------------------------------------------ serper
def test_serper_speaks_the_upstream_api(fake_http: FakeHTTP) -> None:
    fake_http.json_route("POST", "/search", SERPER_REPLY)
    backend = SerperSearch("key-123", url=f"{fake_http.base_url}/search", max_retries=0)
    result = backend.search("amsel light", 2)
    [request] = fake_http.requests
    assert request.headers["X-API-KEY"] == "key-123" and request.json() == {"q": "amsel light"}
    assert [h.url for h in result.hits] == [
        "https://example.org/amsel",
        "https://example.org/port",
        "https://example.org/3",
    ]
    text = format_result(result, 2)
    assert text.startswith("Knowledge Graph: Amsel Light\nA lighthouse.\nBuilt: 1834")
    assert "Result 0: Amsel Light - Wiki\nURL: https://example.org/amsel\nBuilt in 1834." in text
    assert "Result 1: Port Amsel" in text and "Result 2" not in text
    assert text.endswith("People Also Ask:\nQ: Who built Amsel Light?\nA: Tomas Reyl.")
    assert format_result(backend.search("amsel light", 5), 5).count("Result ") == 3
    clone = pickle.loads(pickle.dumps(backend))  # the HTTP client is not pickled; a new one opens on use
    assert clone.search("amsel light", 1).hits[0].title == "Amsel Light - Wiki"


def test_serper_retries_server_errors_and_fails_cleanly(fake_http: FakeHTTP) -> None:
    calls: list[int] = []

    def flaky(request: Request) -> tuple[int, str, object]:
        calls.append(1)
        return (503, "text/plain", "busy") if len(calls) == 1 else (200, "application/json", {"organic": []})

    fake_http.route("POST", "/search", flaky)
    backend = SerperSearch("k", url=f"{fake_http.base_url}/search", max_retries=1)
    result = backend.search("nothing", 3)
    assert len(calls) == 2 and format_result(result, 3) == "No results returned for query: nothing"

    fake_http.json_route("POST", "/search", {"message": "Unauthorized."}, status=403)
    with pytest.raises(BackendError, match="403"):
        backend.search("q", 3)
    assert len(fake_http.requests) == 3  # a client error is not retried
    fake_http.route("POST", "/search", lambda _r: (200, "application/json", "not json{"))
    with pytest.raises(BackendError, match="not JSON"):
        backend.search("q", 3)
    unreachable = SerperSearch("k", url="http://127.0.0.1:9/search", timeout=2, max_retries=0)
    with pytest.raises(BackendError, match="request failed"):
        unreachable.search("q", 3)
    with pytest.raises(ValueError, match="API key"):
        SerperSearch("")


# ------------------------------------------------------------------- pages
HTML = """<html><head><title>T</title><style>p {color: red}</style></head><body>
<h1>Amsel Light</h1><script>var x = 1;</script>
<p>Built in 1834 by Tomas&nbsp;Reyl.</p><div>It is 41 metres tall.</div>
<ul><li>one</li><li>two &amp; three</li></ul></body></html>"""


def test_http_pages_read_html_and_text_and_cache_them(fake_http: FakeHTTP) -> None:
    fake_http.route("GET", "/page", lambda _r: (200, "text/html; charset=utf-8", HTML))
    fake_http.route("GET", "/plain", lambda _r: (200, "text/plain", "line a  \n\n\n\nline b"))
    pages = HttpPages(timeout=5, cache_size=1)
    page = pages.open(f"{fake_http.base_url}/page")
    assert page.error is None and page.page_format == "html->text"
    assert page.content == "Amsel Light\n\nBuilt in 1834 by Tomas Reyl.\n\nIt is 41 metres tall.\n\none\n\ntwo & three"
    assert pages.open(f"{fake_http.base_url}/page") == page and len(fake_http.requests) == 1  # cached
    plain = pages.open(f"{fake_http.base_url}/plain")
    assert plain.content == "line a\n\nline b" and plain.page_format == "text"
    pages.open(f"{fake_http.base_url}/page")  # evicted by the bounded cache: fetched again
    assert len(fake_http.requests) == 3


def test_http_page_failures_are_page_errors_not_exceptions(fake_http: FakeHTTP) -> None:
    pages = HttpPages(timeout=2)
    missing = pages.open(f"{fake_http.base_url}/missing")
    assert missing.content is None and missing.error is not None and "HTTP 404" in missing.error
    assert pages.open(f"{fake_http.base_url}/missing").error and len(fake_http.requests) == 2  # errors not cached
    assert "only http(s)" in str(pages.open("file:///etc/passwd").error)
    assert "ConnectError" in str(pages.open("http://127.0.0.1:9/x").error)


def test_pdf_without_pdfminer_is_a_named_page_error(fake_http: FakeHTTP, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pdfminer", None)
    monkeypatch.setitem(sys.modules, "pdfminer.high_level", None)
    fake_http.route("GET", "/doc.pdf", lambda _r: (200, "application/pdf", "%PDF-1.4 ..."))
    page = HttpPages().open(f"{fake_http.base_url}/doc.pdf")
    assert page.content is None and "pdfminer.six" in str(page.error)


def test_html_to_text_survives_broken_markup() -> None:
    assert html_to_text("<p>a<b>b</p><div>c") == "ab\n\nc"
    assert html_to_text("") == ""


# ------------------------------------------------------------------ corpus
def test_bm25_finds_the_document_that_answers() -> None:
    corpus = Corpus()
    search = LocalSearch(corpus)
    result = search.search("How many metres long is the Kessa Bridge", 3)
    assert result.hits[0].url == "corpus://kessa-bridge"
    assert result.hits[0].snippet == "The bridge is 610 metres long."
    assert len(result.hits) <= 3
    assert search.search("zzzz qqqq", 3).hits == []
    pages = LocalPages(corpus)
    assert pages.open("corpus://mount-tarn").content is not None
    assert "not in the corpus" in str(pages.open("https://example.org/").error)
    clone = pickle.loads(pickle.dumps(search))
    assert clone.search("Kessa Bridge length metres", 1).hits[0].url == "corpus://kessa-bridge"


def test_corpus_from_a_folder_and_bad_rows(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("# Alpha notes\nThe alpha value is 7.\n")
    (tmp_path / "b.txt").write_text("Beta\nbeta is 9\n")
    docs = load_documents(str(tmp_path))
    assert [(d.url, d.title) for d in docs] == [("corpus://b.txt", "Beta"), ("corpus://notes/a.md", "Alpha notes")]
    assert LocalSearch(Corpus(str(tmp_path))).search("alpha value", 1).hits[0].url == "corpus://notes/a.md"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"title": "no url"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1"):
        load_documents(str(bad))
    with pytest.raises(FileNotFoundError):
        load_documents(str(tmp_path / "nope.jsonl"))


# ------------------------------------------------------------------- lines
def test_line_ranges_are_normalised_like_upstream() -> None:
    assert normalize_line_ranges([3, 1]) == [(1, 3)]
    assert normalize_line_ranges([[5, 8], [0, 2], [7, 9], [-4, -1], [-2, 1], "x", [1], [True, 2]]) == [(0, 2), (5, 9)]
    assert normalize_line_ranges("0-3") == []
    text = "l0\nl1\nl2"
    assert render_line_ranges(text, [(1, 5), (7, 8)]) == "L1..5:\n\n```txt\nl1\nl2\n```\n\nL7..8: "
    assert truncate("abcdef", 3) == "abc\n...\n[truncated]" and truncate("abc", 3) == "abc"


def test_scan_block_reports_matches_context_and_errors() -> None:
    text = "alpha\nbeta\ngamma beta\ndelta"
    block = scan_block("u", text, None, "text", "BETA", context_lines=1, max_matches=1)
    assert "line_count: 4" in block and "matches:\nL1: beta\nmatches_truncated: true" in block
    assert "context_blocks:\nL0..2:" in block
    assert "pattern_error:" in scan_block("u", text, None, "text", "(", 0, 5)
    assert "matches: (none)" in scan_block("u", text, None, "text", "omega", 0, 5)
    assert "matches: (unavailable)" in scan_block("u", None, "Error fetching u", "error", "a", 0, 5)
    assert "pattern:" not in scan_block("u", text, None, "text", None)


# ------------------------------------------------------------------- judge
@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("yes", True),
        ("Yes.", True),
        ("  NO", False),
        ("no, yes-men would say otherwise", False),
        ("<think>maybe yes</think>no", False),
        ("reasoning... </think> Yes", True),
        ("Correct", True),
        ("incorrect", False),
        ("", None),
        ("I cannot tell", None),
        ("yesterday", None),
    ],
)
def test_verdict_parsing(reply: str, verdict: bool | None) -> None:
    assert parse_verdict(reply) is verdict


def test_strip_think_and_match_judge() -> None:
    assert strip_think("<think>x</think> final") == "final"
    judge = MatchJudge()
    assert judge.judge("q", "the Hart Cup", "They receive the Hart cup!").correct is True
    assert judge.judge("q", "1947", "It is 1,947 metres high").correct is True
    assert judge.judge("q", "610", "6100 metres").correct is False
    assert judge.judge("q", "", "anything").correct is False


def test_model_judge_chat_api(fake_http: FakeHTTP) -> None:
    fake_http.json_route("POST", "/v1/chat/completions", {"choices": [{"message": {"content": "Yes"}}]})
    judge = ModelJudge(f"{fake_http.base_url}/v1/", "judge-1", api_key="sk-x", api="chat", max_retries=0)
    verdict = judge.judge("What?", "Port Amsel", "Port Amsel, I think")
    assert verdict.correct is True and verdict.raw == "Yes"
    [request] = fake_http.requests
    body = request.json()
    assert request.headers["Authorization"] == "Bearer sk-x"
    assert body["model"] == "judge-1" and body["temperature"] == 0.0 and body["max_tokens"] == 10
    prompt = body["messages"][0]["content"]
    assert "Question: What?\nReference Answer: Port Amsel\nResponse: Port Amsel, I think" in prompt


def test_model_judge_completions_api_and_failures(fake_http: FakeHTTP) -> None:
    fake_http.json_route("POST", "/v1/completions", {"choices": [{"text": " maybe"}]})
    judge = ModelJudge(f"{fake_http.base_url}/v1", None, api="completions", max_retries=0)
    assert judge.judge("q", "a", "r").correct is None  # replied, but no verdict
    body = fake_http.requests[0].json()
    assert "model" not in body and body["prompt"].startswith("You are a helpful judge.")
    assert "Authorization" not in fake_http.requests[0].headers
    fake_http.json_route("POST", "/v1/completions", {"choices": []})
    with pytest.raises(BackendError, match="no choices"):
        judge.judge("q", "a", "r")
    fake_http.json_route("POST", "/v1/completions", {"error": "bad"}, status=400)
    with pytest.raises(BackendError, match="400"):
        judge.judge("q", "a", "r")
    with pytest.raises(ValueError, match="chat"):
        ModelJudge("http://x", None, api="responses")  # type: ignore[arg-type]
