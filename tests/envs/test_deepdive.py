"""deepdive: the research agent's tools, rollouts, rewards, failures, and the whole loop on the CPU.

The offline setup throughout: the builtin questions, the local corpus for search and
pages, and either the string-match judge or Telescope's embedded engine (``tiny:test``,
served in this process) as the judge model. Nothing reaches the network.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from http_fakes import FakeHTTP

from telescope.api.environment import RolloutState
from telescope.api.records import FinishReason, Message, Sample
from telescope.testing.environment import TOOL_METRIC_KEYS, EnvironmentConformance
from telescope_envs.deepdive import DeepDiveEnvironment
from telescope_envs.deepdive.judge import ModelJudge, Verdict

LOCAL: dict[str, Any] = {
    "dataset_name": "builtin",
    "dataset_test_size": 0.0,
    "search_backend": "local",
    "page_backend": "local",
}


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def local_env(**kwargs: Any) -> DeepDiveEnvironment:
    return DeepDiveEnvironment(**{**LOCAL, "judge_backend": "match", **kwargs})


def play(env: DeepDiveEnvironment, sample: Sample, replies: list[str]) -> tuple[list[Message], RolloutState]:
    """The orchestrator's loop with scripted replies; returns the conversation and the state."""
    state = env.initial_state(sample)
    messages = env.format_prompt(sample)
    for reply in replies:
        messages.append({"role": "assistant", "content": reply})
        state.turn += 1
        if env.is_done(messages, state):
            break
        messages.extend(env.env_response(messages, state))
    return messages, state


class CountingJudge:
    """A judge that records its calls and answers from a fixed verdict (or raises)."""

    def __init__(self, correct: bool | None = True, fail: bool = False) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.correct = correct
        self.fail = fail

    def judge(self, question: str, reference: str, response: str) -> Verdict:
        self.calls.append((question, reference, response))
        if self.fail:
            raise ConnectionError("the judge is down")
        return Verdict(self.correct, "yes" if self.correct else "no")


# ------------------------------------------------------------- conformance
class TestDeepDiveConformance(EnvironmentConformance):
    def environment_factory(self) -> DeepDiveEnvironment:
        return local_env()

    def right_replies(self, sample: Sample) -> list[str]:
        question = str(sample.metadata["raw_question"])
        return [call("search_web", queries=[question]), call("finish", final_answer=str(sample.answer))]


class TestDeepDiveBoxedConformance(EnvironmentConformance):
    def environment_factory(self) -> DeepDiveEnvironment:
        return local_env(finish_with_tool=False, tool_prompt="compact")

    def right_replies(self, sample: Sample) -> list[str]:
        return [call("search_web", queries=["Veloria"]), f"The answer is \\boxed{{{sample.answer}}}."]


# ------------------------------------------------------------------ rollout
def test_a_research_rollout_reads_the_corpus_and_finishes() -> None:
    env = local_env()
    sample = next(s for s in env.load_dataset() if s.answer == "Drossmark")
    replies = [
        call("search_web", queries=["Amsel Light engineer", "Tomas Reyl"], num_results_per_query=2),
        call("scan_page", url="corpus://tomas-reyl", pattern="born", context_lines=1),
        call("open_lines", url="corpus://drossmark", lines=[0, 1]) + call("open_lines", url="https://nowhere.example/"),
        call("finish", final_answer="He was born in Drossmark."),
    ]
    messages, state = play(env, sample, replies)
    tool_texts = [m["content"] for m in messages if m["role"] == "tool"]
    assert len(tool_texts) == 4 and state.turn == 4
    assert "Results for query `Amsel Light engineer`" in tool_texts[0] and "URL: corpus://tomas-reyl" in tool_texts[0]
    assert "L1: He was born in the mainland town of Drossmark" in tool_texts[1]
    assert tool_texts[2].startswith("L0..1:\n\n```txt\nDrossmark is a town") and "river Oll" in tool_texts[2]
    assert "not in the corpus" in tool_texts[3]
    result = env.compute_reward(messages, sample, state)
    m = result.sample_metrics
    assert result.error is None and result.total_reward == 1.0
    assert all(key in m for key in TOOL_METRIC_KEYS)
    assert (m["search_web_calls"], m["scan_page_calls"], m["open_lines_calls"], m["finish_calls"]) == (1, 1, 2, 1)
    assert m["total_tool_calls"] == 5 and m["tool_success_rate"] == 1.0 and m["unique_tools_used"] == 4
    assert m["finished"] == 1.0 and m["has_answer"] == 1.0 and m["search_web_mean_queries"] == 2.0
    assert m["judge_reward"] == 1.0 and m["judge_error"] == 0.0 and m["backend_failures"] == 0.0
    assert env.compute_reward(messages, sample, state) == result  # scoring twice changes nothing


def test_the_judge_sees_the_question_reference_and_final_answer_only() -> None:
    judge = CountingJudge(correct=False)
    env = local_env(judge_backend=judge)
    sample = env.load_dataset()[0]
    messages, state = play(env, sample, ["<think>hmm</think>" + call("finish", final_answer="<think>x</think> Lind")])
    result = env.compute_reward(messages, sample, state)
    assert judge.calls == [("What is the capital of Veloria?", "Port Amsel", "Lind")]
    assert result.total_reward == 0.0 and result.sample_metrics["judge_reward"] == 0.0
    # a reply without a tool call ends the rollout; its text (tool calls removed) is the answer
    messages, state = play(env, sample, [call("search_web", queries=["capital"]), "It is Port Amsel."])
    env.compute_reward(messages, sample, state)
    assert judge.calls[-1][2] == "It is Port Amsel." and state.turn == 2
    # max_turns reached mid-research: no answer, no judge call
    short = local_env(judge_backend=judge, max_turns=2)
    messages, state = play(short, sample, [call("search_web", queries=["a"]), call("search_web", queries=["b"])])
    result = short.compute_reward(messages, sample, state)
    assert state.turn == 2 and len(judge.calls) == 2
    assert result.sample_metrics["has_answer"] == 0.0 and result.total_reward == 0.0 and result.error is None


def test_malformed_finish_does_not_end_the_rollout() -> None:
    env = local_env()
    sample = env.load_dataset()[0]
    messages, state = play(
        env, sample, [call("finish", answer="Port Amsel"), call("finish", final_answer="Port Amsel")]
    )
    assert state.turn == 2 and "bad arguments for finish" in messages[-2]["content"]
    result = env.compute_reward(messages, sample, state)
    assert result.total_reward == 1.0 and result.sample_metrics["tool_error_count"] == 1.0


def test_redundant_queries_are_penalised_when_asked() -> None:
    env = local_env(redundancy_penalty_weight=0.5)
    sample = env.load_dataset()[0]
    queries = ["capital of Veloria", "Veloria capital"]  # word sets {capital, of, veloria}, {veloria, capital}
    messages, state = play(
        env, sample, [call("search_web", queries=queries), call("finish", final_answer="Port Amsel")]
    )
    result = env.compute_reward(messages, sample, state)
    assert result.sample_metrics["query_redundancy"] == pytest.approx(2 / 3)
    assert result.total_reward == pytest.approx(1 - 0.5 * 2 / 3)


def test_search_backend_failure_is_counted_and_errors_the_sample(
    fake_http: FakeHTTP, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_http.json_route("POST", "/search", {"message": "server error"}, status=500)
    monkeypatch.setenv("TEST_SERPER_KEY", "k")
    judge = CountingJudge()
    env = DeepDiveEnvironment(
        dataset_name="builtin",
        dataset_test_size=0.0,
        search_backend="serper",
        serper_api_key_var="TEST_SERPER_KEY",
        search_url=f"{fake_http.base_url}/search",
        max_retries=0,
        page_backend="local",
        judge_backend=judge,
    )
    sample = env.load_dataset()[0]
    messages, state = play(env, sample, [call("search_web", queries=["x"]), call("finish", final_answer="Port Amsel")])
    assert messages[-2]["content"].startswith("Error: search_web failed: search API error 500")
    result = env.compute_reward(messages, sample, state)
    assert result.error is not None and "backend failure" in result.error
    assert result.sample_metrics["backend_failures"] == 1.0 and result.sample_metrics["tool_error_count"] == 1.0
    assert judge.calls == [] and result.total_reward == 0.0


def test_judge_failure_is_contained_and_counted() -> None:
    env = local_env(judge_backend=CountingJudge(fail=True))
    sample = env.load_dataset()[0]
    messages, state = play(env, sample, [call("finish", final_answer="Port Amsel")])
    result = env.compute_reward(messages, sample, state)
    assert result.error is not None and "ConnectionError" in result.error
    assert result.sample_metrics["judge_error"] == 1.0 and result.total_reward == 0.0


def test_configuration_errors_are_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ValueError, match=r"SERPER_API_KEY"):
        DeepDiveEnvironment(page_backend="local", judge_backend="match")
    with pytest.raises(ValueError, match=r"OPENAI_API_KEY"):
        DeepDiveEnvironment(search_backend="local", page_backend="local")
    for bad in ({"search_backend": "bing"}, {"page_backend": "ftp"}, {"judge_backend": "vibes"}, {"max_turns": 0}):
        with pytest.raises(ValueError):
            local_env(**bad)
    with pytest.raises(ValueError, match="xml"):
        local_env(tool_call_format="function")
    with pytest.raises(ValueError, match="judge_api"):
        local_env(judge_backend="model", judge_base_url="http://127.0.0.1:9/v1", judge_api="responses")


def test_upstream_keyword_arguments_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERPER_API_KEY", "k")
    monkeypatch.setenv("OPENAI_API_KEY", "sk")
    env = DeepDiveEnvironment(
        max_turns=32,
        serper_api_key_var="SERPER_API_KEY",
        judge_api_key_var="OPENAI_API_KEY",
        judge_model="gpt-4.1-mini",
        judge_base_url=None,
        max_search_results=10,
        max_response_chars=20_000,
        serper_timeout=15.0,
        dataset_name="zai-org/DeepDive",
        dataset_split="qa_rl",
        dataset_test_size=0.1,
        dataset_seed=2025,
        redundancy_penalty_weight=0.0,
        finish_with_tool=True,
        strip_think_tags=True,
        tool_call_format="xml",
    )
    assert isinstance(env.judge, ModelJudge) and env.judge.base_url == "https://api.openai.com/v1"
    assert env.judge.model == "gpt-4.1-mini" and env.judge.api == "chat"


def test_held_out_split_is_the_datasets_split() -> None:
    import datasets

    from telescope_envs.deepdive.corpus import DATA_DIR

    rows = [json.loads(line) for line in (DATA_DIR / "questions.jsonl").read_text().splitlines()]
    split = datasets.Dataset.from_list(rows).train_test_split(test_size=0.25, seed=7)
    train = DeepDiveEnvironment(**{**LOCAL, "dataset_test_size": 0.25, "dataset_seed": 7}, judge_backend="match")
    test = DeepDiveEnvironment(
        **{**LOCAL, "dataset_test_size": 0.25, "dataset_seed": 7}, judge_backend="match", use_held_out=True
    )
    assert [s.prompt for s in train.load_dataset()] == split["train"]["question"]
    assert [s.prompt for s in test.load_dataset()] == split["test"]["question"]
    assert len(local_env(max_samples=3).load_dataset()) == 3


def test_prompts_and_demonstration() -> None:
    env, compact = local_env(), local_env(tool_prompt="compact")
    sample = env.load_dataset()[0]
    full, short = env.format_prompt(sample)[0]["content"], compact.format_prompt(sample)[0]["content"]
    assert '"name": "open_lines"' in full and "call finish" in full
    assert "search_web(queries, num_results_per_query=3): Search the web" in short and len(short) < len(full) / 2
    boxed = local_env(finish_with_tool=False)
    assert "finish" not in [s["function"]["name"] for s in boxed.tool_schemas]
    assert str(boxed.load_dataset()[0].prompt).endswith("final answer in \\boxed{}.")
    demo = env.demonstration(sample)
    assert demo is not None and "Port Amsel" not in demo
    messages, _ = play(env, sample, [demo])
    assert messages[-1]["role"] == "tool" and "Result 0" in messages[-1]["content"]
    assert env.demonstration_turns(sample) is None  # the search only, unless asked for the answer too
    bare = local_env(tool_prompt="none").format_prompt(sample)[0]["content"]
    assert "search" in bare and "tool_call" not in bare and len(bare) < len(short) / 5
    with pytest.raises(ValueError, match="'schemas', 'compact' or 'none'"):
        local_env(tool_prompt="brief")


@pytest.mark.parametrize("finish_with_tool", [True, False])
def test_a_demonstration_can_go_on_to_the_answer(finish_with_tool: bool) -> None:
    env = local_env(demonstrate_answer=True, finish_with_tool=finish_with_tool)
    sample = env.load_dataset()[0]
    turns = env.demonstration_turns(sample)
    assert turns is not None and turns[0] == env.demonstration(sample)
    messages, state = play(env, sample, turns)
    assert [m["role"] for m in messages[2:]] == ["assistant", "tool", "assistant"]
    assert env.final_answer(messages, state) == sample.answer == "Port Amsel"
    assert env.is_done(messages, state)


# ---------------------------------------------- the loop on the CPU, with the embedded engine
def served(base_url: str) -> float:
    """Completions the engine has finished (its vLLM-named counter)."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:request_success_total"))


@pytest.fixture(scope="module")
def engine_server() -> Iterator[tuple[str, str]]:
    """The embedded engine on ``tiny:test``, served in this process: (base url, model path)."""
    from telescope.inference.embedded.engine import Engine, EngineSettings
    from telescope.inference.embedded.server import ServerThread, create_app
    from telescope.models.tiny import resolve_model_path

    model_path = resolve_model_path("tiny:test")
    engine = Engine(EngineSettings(model_path=model_path, max_model_len=1024, max_num_seqs=4)).start()
    server = ServerThread(create_app(engine), host="127.0.0.1", port=0).start()
    yield server.base_url, model_path
    server.stop()
    engine.stop()


def judged_env(base_url: str, **kwargs: Any) -> DeepDiveEnvironment:
    return DeepDiveEnvironment(
        **LOCAL,
        judge_backend="model",
        judge_base_url=f"{base_url}/v1",
        judge_api="completions",
        judge_model=None,
        judge_api_key_var=None,
        judge_max_tokens=4,
        max_retries=0,
        **kwargs,
    )


@pytest.mark.slow
def test_agent_loop_on_cpu_with_the_embedded_engine_as_judge(engine_server: tuple[str, str]) -> None:
    """The orchestrator's own rollout loop: scripted agent, local corpus, the engine judging."""
    from transformers import AutoTokenizer

    from telescope.inference.generation import Generation
    from telescope.orchestrator.chat import ChatRenderer
    from telescope.orchestrator.rollouts import RolloutLimits, run_rollout

    base_url, model_path = engine_server
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(model_path))
    env = judged_env(base_url)
    sample = next(s for s in env.load_dataset() if s.answer == "610")
    replies = [
        call("search_web", queries=["bridge designed by Tomas Reyl"]),
        call("scan_page", url="corpus://kessa-bridge", pattern="metres"),
        call("finish", final_answer="610 metres"),
    ]

    eos = renderer.eos_token_id
    assert eos is not None

    async def generate(prompt_ids: list[int], max_tokens: int, turn: int) -> Generation:
        ids = [*renderer.encode(replies[turn]), eos]
        return Generation(ids, [-0.1] * len(ids), "stop", 0, 0)

    before = served(base_url)
    messages = env.format_prompt(sample)
    rollout = asyncio.run(
        run_rollout(
            env,
            sample,
            messages,
            renderer.prompt_ids(messages),
            renderer=renderer,
            generate=generate,
            policy_version=lambda: 0,
            limits=RolloutLimits(max_tokens=256, max_model_len=100_000),
        )
    )
    assert [t.output_text for t in rollout.turns] == replies
    tool_texts = [m["content"] for m in rollout.messages if m["role"] == "tool"]
    assert "URL: corpus://kessa-bridge" in tool_texts[0] and "L2: The bridge is 610 metres long." in tool_texts[1]
    assert rollout.error is None and rollout.reward is not None
    metrics = rollout.reward.sample_metrics
    assert served(base_url) == before + 1  # exactly one judge request reached the engine
    assert metrics["judge_error"] == 0.0 and metrics["finished"] == 1.0 and metrics["tool_success_rate"] == 1.0
    # the reward is the engine's verdict, parsed: the same greedy request gives the same reply
    judge = ModelJudge(f"{base_url}/v1", None, api="completions", max_tokens=4, max_retries=0)
    verdict = judge.judge(str(sample.metadata["raw_question"]), "610", "610 metres")
    assert metrics["judge_reward"] == float(verdict.correct is True)
    assert metrics["judge_unparsed"] == float(verdict.correct is None)
    assert rollout.reward.total_reward == metrics["judge_reward"]


@pytest.mark.slow
def test_engine_as_agent_and_judge(engine_server: tuple[str, str]) -> None:
    """Both sides on the engine: the tiny model writes the replies (whatever it writes), the engine judges."""
    from transformers import AutoTokenizer

    from telescope.inference.client import InferenceClient
    from telescope.inference.generation import Generation
    from telescope.orchestrator.chat import ChatRenderer
    from telescope.orchestrator.rollouts import RolloutLimits, run_rollout

    base_url, model_path = engine_server
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(model_path))
    env = judged_env(base_url, tool_prompt="compact", max_turns=2, max_response_chars=300)

    async def rollouts() -> list[Any]:
        async with InferenceClient(base_url) as client:

            async def generate(prompt_ids: list[int], max_tokens: int, turn: int) -> Generation:
                result = await client.complete(prompt_ids, max_tokens=max_tokens, temperature=1.0, seed=turn)
                c = result.completions[0]
                reason: FinishReason = "length" if c.finish_reason == "length" else "stop"
                return Generation(c.token_ids, c.logprobs, reason, 0, 0)

            out = []
            for sample in env.load_dataset()[:2]:
                messages = env.format_prompt(sample)
                out.append(
                    await run_rollout(
                        env,
                        sample,
                        messages,
                        renderer.prompt_ids(messages),
                        renderer=renderer,
                        generate=generate,
                        policy_version=lambda: 0,
                        limits=RolloutLimits(max_tokens=16, max_model_len=1024),
                    )
                )
            return out

    for rollout in asyncio.run(rollouts()):
        assert rollout.error is None and rollout.reward is not None and 1 <= len(rollout.turns) <= 2
        metrics = rollout.reward.sample_metrics
        assert metrics["judge_error"] == 0.0 and metrics["judge_reward"] in (0.0, 1.0)


@pytest.mark.slow
def test_a_judge_the_engine_refuses_errors_the_sample_and_the_next_goes_on(engine_server: tuple[str, str]) -> None:
    base_url, _ = engine_server
    broken = DeepDiveEnvironment(
        **LOCAL,
        judge_backend="model",
        judge_base_url=f"{base_url}/v1",
        judge_api="completions",
        judge_model="no-such-model",
        judge_api_key_var=None,
        max_retries=0,
    )
    working = judged_env(base_url)
    sample = broken.load_dataset()[0]
    replies = [call("finish", final_answer="Port Amsel")]
    failed = broken.compute_reward(*_scored(broken, sample, replies))
    assert failed.error is not None and "404" in failed.error and failed.sample_metrics["judge_error"] == 1.0
    fine = working.compute_reward(*_scored(working, sample, replies))
    assert fine.error is None and fine.sample_metrics["judge_error"] == 0.0


def _scored(env: DeepDiveEnvironment, sample: Sample, replies: list[str]) -> tuple[list[Message], Sample, RolloutState]:
    messages, state = play(env, sample, replies)
    return messages, sample, state


def test_the_cpu_example_validates_and_its_prompts_fit_the_tiny_model(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys
    from pathlib import Path

    import yaml
    from transformers import AutoTokenizer

    from telescope.models.tiny import resolve_model_path
    from telescope.orchestrator.chat import ChatRenderer

    repo = Path(__file__).resolve().parents[2]
    config = repo / "configs" / "examples" / "cpu" / "deepdive_tiny.yaml"
    cli = "import sys; from telescope.cli.main import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-c", cli, "config", "validate", str(config)], cwd=repo, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    monkeypatch.chdir(repo)  # the example's data paths are relative to the repository root
    loaded = yaml.safe_load(config.read_text())
    [entry] = loaded["environments"]
    env = DeepDiveEnvironment(**entry["kwargs"])
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(resolve_model_path(loaded["model"])))
    longest = max(len(renderer.prompt_ids(env.format_prompt(s))) for s in env.load_dataset())
    assert longest + loaded["max_tokens"] < loaded["max_model_len"]
