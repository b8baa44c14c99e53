"""The inference limits ``max_num_seqs`` and ``max_num_batched_tokens``.

vLLM gets them as ``--max-num-seqs`` / ``--max-num-batched-tokens``; the embedded engine
honours the same meaning: at most ``max_num_seqs`` sequences hold a slot (running,
joining or prefilling), and one engine step processes at most ``max_num_batched_tokens``
tokens (one per decoding sequence plus the prompt tokens prefilled; longer prompts
are prefilled in chunks). The engine's ``step_log`` records every step's tokens and
decoding sequences; results under the limits equal those without (same seeds).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest
import torch
from inference_helpers import mean_k3, trainer_logprobs

from telescope.api.context import InferenceContext
from telescope.config.errors import ConfigError
from telescope.config.loader import load_config
from telescope.inference.embedded.engine import Engine, EngineSettings, GenerationParams, RequestResult
from telescope.inference.plugin import VLLMSettings
from telescope.inference.vllm_backend import serve_command

pytestmark = pytest.mark.timeout(180)

PROMPTS = [[5, 6, 7], [40 + i for i in range(23)], [100, 3], [7] * 37, [9, 8] * 9, [11] * 5]


def run_all(engine: Engine, prompts: list[list[int]], params: list[GenerationParams]) -> list[RequestResult]:
    results: dict[int, RequestResult] = {}
    done = threading.Event()

    def callback(i: int):  # type: ignore[no-untyped-def]
        def on_done(result: RequestResult) -> None:
            results[i] = result
            if len(results) == len(prompts):
                done.set()

        return on_done

    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.submit(f"r-{time.monotonic_ns()}-{i}", prompt, p, callback(i))
    assert done.wait(120)
    return [results[i] for i in range(len(prompts))]


def params_for(n_prompts: int, n: int = 1) -> list[GenerationParams]:
    return [GenerationParams(max_tokens=6 + 3 * i, seed=100 + i, n=n, ignore_eos=True) for i in range(n_prompts)]


@pytest.fixture(scope="module")
def reference(tiny_model_path: Path) -> list[RequestResult]:
    """Every prompt alone on an engine without limits."""
    engine = Engine(EngineSettings(model_path=str(tiny_model_path), max_model_len=512, max_num_seqs=16)).start()
    try:
        return [run_all(engine, [p], [q])[0] for p, q in zip(PROMPTS, params_for(len(PROMPTS), n=2), strict=True)]
    finally:
        engine.stop()


def limited(tiny_model_path: Path, **limits: int | None) -> Engine:
    return Engine(EngineSettings(model_path=str(tiny_model_path), max_model_len=512, **limits)).start()  # type: ignore[arg-type]


def assert_same_as_alone(results: list[RequestResult], reference: list[RequestResult], model: object) -> None:
    for got, ref in zip(results, reference, strict=True):
        for seq, ref_seq in zip(got.sequences, ref.sequences, strict=True):
            assert seq.token_ids == ref_seq.token_ids
            assert torch.allclose(torch.tensor(seq.logprobs), torch.tensor(ref_seq.logprobs), atol=1e-4)
            recomputed = trainer_logprobs(model, got.prompt_token_ids, seq.token_ids, 1.0)
            assert mean_k3(seq.logprobs, recomputed) < 1e-3


def test_max_num_seqs_caps_the_sequences_running_at_once(tiny_model_path: Path, reference: list) -> None:
    engine = limited(tiny_model_path, max_num_seqs=3)
    try:
        peak = 0
        stop = threading.Event()

        def watch() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, int(engine.counts()["running"]))
                time.sleep(0.0005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        results = run_all(engine, PROMPTS, params_for(len(PROMPTS), n=2))  # 12 sequences for 3 slots
        stop.set()
        watcher.join()
        decoded = [d for _, d in engine.step_log]
        assert max(decoded) <= 3 and peak <= 3
        assert max(decoded) >= 2  # several sequences did decode together
        assert_same_as_alone(results, reference, engine.model)
        with pytest.raises(ValueError, match="max_num_seqs"):
            engine.submit("too-many", [1, 2], GenerationParams(n=4), lambda r: None)
    finally:
        engine.stop()


@pytest.mark.parametrize(("budget", "seqs"), [(8, 4), (5, 2), (64, 8)])
def test_max_num_batched_tokens_bounds_every_step_and_chunks_long_prompts(
    tiny_model_path: Path, reference: list, budget: int, seqs: int
) -> None:
    engine = limited(tiny_model_path, max_num_seqs=seqs, max_num_batched_tokens=budget)
    try:
        results = run_all(engine, PROMPTS, params_for(len(PROMPTS), n=2))
        with engine.paused():  # held between steps: the last step is over and logged
            tokens = [t for t, _ in engine.step_log]
        assert max(tokens) <= budget
        assert max(d for _, d in engine.step_log) <= seqs
        prompt_tokens = sum(len(p) for p in PROMPTS)
        generated = sum(len(s.token_ids) for r in results for s in r.sequences)
        # every prompt token once, every generated token but each sequence's first (sampled at the prefill's end)
        assert sum(tokens) == engine.stats["batched_tokens"] == prompt_tokens + generated - 2 * len(PROMPTS)
        if budget < max(len(p) for p in PROMPTS):
            assert sum(1 for t in tokens if t == budget) >= 2  # long prompts took several full steps
        assert_same_as_alone(results, reference, engine.model)
    finally:
        engine.stop()


def test_a_request_aborted_while_its_prompt_is_chunked(tiny_model_path: Path) -> None:
    engine = limited(tiny_model_path, max_num_seqs=2, max_num_batched_tokens=2)
    try:
        box: list[RequestResult] = []
        done = threading.Event()

        def on_done(result: RequestResult) -> None:
            box.append(result)
            done.set()

        with engine.paused():  # hold the loop so the abort lands mid-prefill
            engine.submit("long", list(range(5, 205)), GenerationParams(max_tokens=4), on_done)
        deadline = time.monotonic() + 10
        while engine.stats["batched_tokens"] < 4 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert engine.abort("long")
        assert done.wait(30)
        assert box[0].sequences[0].finish_reason == "abort" and box[0].sequences[0].token_ids == []
        after = engine.generate([5, 6, 7], GenerationParams(max_tokens=3, seed=1, ignore_eos=True))
        assert len(after.sequences[0].token_ids) == 3
        assert engine.counts()["running"] == 0
    finally:
        engine.stop()


# ----------------------------------------------------------------- settings and flags


def context(**overrides: object) -> InferenceContext:
    return dataclasses.replace(InferenceContext(model="m", max_concurrent_sequences=32 * 8), **overrides)  # type: ignore[arg-type]


def test_engine_settings_from_the_context(tiny_model_path: Path) -> None:
    model = str(tiny_model_path)
    default = EngineSettings.from_context(context(model=model), device="cpu")
    assert default.max_num_seqs == 256 and default.max_num_batched_tokens is None  # 32 x 8, capped at 256
    explicit = EngineSettings.from_context(context(model=model, max_num_seqs=12, max_num_batched_tokens=100), "cpu")
    assert explicit.max_num_seqs == 12 and explicit.max_num_batched_tokens == 100
    budget_only = EngineSettings.from_context(context(model=model, max_num_batched_tokens=40), device="cpu")
    assert budget_only.max_num_seqs == 40  # each running sequence decodes one token per step
    assert EngineSettings.from_json(explicit.to_json()) == explicit
    with pytest.raises(ValueError, match="at least max_num_seqs"):
        Engine(EngineSettings(model_path=model, max_num_seqs=8, max_num_batched_tokens=4))


def test_vllm_gets_the_flags() -> None:
    settings = VLLMSettings()
    flags = serve_command(
        context(max_num_seqs=48, max_num_batched_tokens=8192), 0, settings, model_path="m", executable="vllm"
    )
    pairs = dict(zip(flags[3::2], flags[4::2], strict=False))
    assert pairs["--max-num-seqs"] == "48" and pairs["--max-num-batched-tokens"] == "8192"
    plain = serve_command(context(), 0, settings, model_path="m", executable="vllm")
    assert "--max-num-batched-tokens" not in plain
    assert dict(zip(plain[3::2], plain[4::2], strict=False))["--max-num-seqs"] == "256"  # 32 prompts x 8 samples
    capped = serve_command(context(max_num_batched_tokens=100), 0, settings, model_path="m", executable="vllm")
    assert dict(zip(capped[3::2], capped[4::2], strict=False))["--max-num-seqs"] == "100"


def test_the_config_carries_the_limits_to_the_context() -> None:
    values = {"environments": [{"name": "countdown"}], "max_num_seqs": 64, "max_num_batched_tokens": 4096}
    config = load_config(None, values, check_plugins=False).config
    ctx = InferenceContext.from_config(config)
    assert (ctx.max_num_seqs, ctx.max_num_batched_tokens) == (64, 4096)
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        load_config(None, {**values, "max_num_batched_tokens": 32}, check_plugins=False)
    with pytest.raises(ConfigError, match="max_num_seqs"):
        load_config(None, {**values, "max_num_seqs": 0}, check_plugins=False)


def test_the_step_log_counts_a_step_before_its_callbacks_run(tiny_model_path: Path) -> None:
    """A completion callback sees the step that finished it in ``step_log`` (the test above read it racily)."""
    engine = limited(tiny_model_path, max_num_seqs=2, max_num_batched_tokens=4)
    try:
        seen: list[int] = []
        done = threading.Event()

        def on_done(result: RequestResult) -> None:
            seen.append(sum(t for t, _ in engine.step_log))
            done.set()

        engine.submit("one", [5, 6, 7, 8, 9, 10], GenerationParams(max_tokens=5, seed=3, ignore_eos=True), on_done)
        assert done.wait(60)
        assert seen == [6 + 5 - 1]  # every prompt token and every generated token but the first
    finally:
        engine.stop()
