"""The embedded engine without HTTP: log-probability correctness, sampling, batching, scheduling."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from inference_helpers import mean_k3, trainer_logprobs

from telescope.inference.embedded.engine import Engine, EngineSettings, GenerationParams, RequestResult

PROMPTS = [[5, 6, 7], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [100, 3], [7] * 20]


def _submit_all(engine: Engine, prompts: list[list[int]], params: GenerationParams) -> list[RequestResult]:
    results: dict[int, RequestResult] = {}
    done = threading.Event()

    def callback(i: int):  # type: ignore[no-untyped-def]
        def on_done(result: RequestResult) -> None:
            results[i] = result
            if len(results) == len(prompts):
                done.set()

        return on_done

    for i, prompt in enumerate(prompts):
        engine.submit(f"batch-{time.monotonic_ns()}-{i}", prompt, params, callback(i))
    assert done.wait(60)
    return [results[i] for i in range(len(prompts))]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_trainer_recomputation(engine: Engine, temperature: float) -> None:
    """Batched, padded decoding reports log_softmax(logits / T) of the sampled token, as the trainer computes it."""
    params = GenerationParams(max_tokens=24, temperature=temperature, n=2, seed=11, ignore_eos=True)
    for result in _submit_all(engine, PROMPTS, params):
        for seq in result.sequences:
            assert len(seq.token_ids) == 24
            ref = trainer_logprobs(engine.model, result.prompt_token_ids, seq.token_ids, temperature)
            assert mean_k3(seq.logprobs, ref) < 1e-3
            assert torch.allclose(torch.tensor(seq.logprobs), ref, atol=1e-4)


def test_logprobs_with_top_p_describe_the_untruncated_distribution(engine: Engine) -> None:
    params = GenerationParams(max_tokens=16, temperature=0.8, top_p=0.5, seed=3, ignore_eos=True)
    result = engine.generate(PROMPTS[1], params)
    seq = result.sequences[0]
    ref = trainer_logprobs(engine.model, PROMPTS[1], seq.token_ids, 0.8)
    assert torch.allclose(torch.tensor(seq.logprobs), ref, atol=1e-4)


def test_seeded_sampling_is_reproducible_alone_and_in_a_batch(engine: Engine) -> None:
    params = GenerationParams(max_tokens=20, temperature=1.0, seed=1234, ignore_eos=True)
    alone = engine.generate(PROMPTS[0], params).sequences[0].token_ids
    again = engine.generate(PROMPTS[0], params).sequences[0].token_ids
    assert alone == again
    others = GenerationParams(max_tokens=30, temperature=1.0, ignore_eos=True)
    results: list[RequestResult] = []
    engine.submit("other-1", PROMPTS[3], others, lambda r: None)
    engine.submit("other-2", PROMPTS[1], others, lambda r: None)
    results.append(engine.generate(PROMPTS[0], params))
    assert results[0].sequences[0].token_ids == alone
    unseeded = GenerationParams(max_tokens=20, temperature=1.0, ignore_eos=True)
    assert engine.generate(PROMPTS[0], unseeded).sequences[0].token_ids != alone


def test_n_samples_use_distinct_seeds(engine: Engine) -> None:
    result = engine.generate(PROMPTS[2], GenerationParams(max_tokens=12, n=3, seed=5, ignore_eos=True))
    first = engine.generate(PROMPTS[2], GenerationParams(max_tokens=12, n=1, seed=5, ignore_eos=True))
    tokens = [s.token_ids for s in result.sequences]
    assert len({tuple(t) for t in tokens}) == 3
    assert tokens[0] == first.sequences[0].token_ids


def test_requests_join_a_running_batch(engine: Engine) -> None:
    """A request submitted mid-generation joins between decode steps and gives the same tokens as alone."""
    long_params = GenerationParams(max_tokens=150, seed=1, ignore_eos=True)
    short_params = GenerationParams(max_tokens=10, seed=2, ignore_eos=True)
    short_alone = engine.generate(PROMPTS[1], short_params).sequences[0].token_ids
    long_done = threading.Event()
    box: list[RequestResult] = []

    def on_long(result: RequestResult) -> None:
        box.append(result)
        long_done.set()

    engine.submit("long", PROMPTS[0], long_params, on_long)
    deadline = time.monotonic() + 10
    while engine.counts()["running"] == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    short = engine.generate(PROMPTS[1], short_params)
    assert not long_done.is_set(), "the short request should finish while the long one is still decoding"
    assert short.sequences[0].token_ids == short_alone
    assert long_done.wait(60)
    long_alone = engine.generate(PROMPTS[0], long_params).sequences[0].token_ids
    assert box[0].sequences[0].token_ids == long_alone


def test_stop_conditions(engine: Engine) -> None:
    res = engine.generate(PROMPTS[0], GenerationParams(max_tokens=7, ignore_eos=True, seed=0))
    assert res.sequences[0].finish_reason == "length" and len(res.sequences[0].token_ids) == 7
    greedy = engine.generate(PROMPTS[0], GenerationParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    stop_token = greedy.sequences[0].token_ids[4]
    res = engine.generate(
        PROMPTS[0], GenerationParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop_token_ids=[stop_token])
    )
    seq = res.sequences[0]
    assert seq.finish_reason == "stop" and seq.stop_reason == stop_token and seq.token_ids[-1] == stop_token
    text = greedy.sequences[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 1]
    if stop:
        res = engine.generate(
            PROMPTS[0], GenerationParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop=[stop])
        )
        assert res.sequences[0].finish_reason == "stop" and stop not in res.sequences[0].text
    eos = next(iter(engine.eos_token_ids))
    with pytest.raises(ValueError, match="maximum context length"):
        engine.generate([1] * 500, GenerationParams(max_tokens=20))
    assert eos in engine.eos_token_ids


def test_priority_policy_admits_lower_values_first(tiny_model_path: Path) -> None:
    order: list[str] = []
    for policy, expected in (("priority", ["urgent", "late"]), ("fcfs", ["late", "urgent"])):
        eng = Engine(
            EngineSettings(model_path=str(tiny_model_path), max_model_len=512, max_num_seqs=1, scheduling_policy=policy)
        ).start()  # type: ignore[arg-type]
        try:
            order.clear()
            done = threading.Event()
            eng.submit("blocker", [5, 6], GenerationParams(max_tokens=60, ignore_eos=True), lambda r: None)
            eng.submit(
                "late",
                [5, 6],
                GenerationParams(max_tokens=2, ignore_eos=True, priority=5),
                lambda r: order.append("late"),
            )

            def on_urgent(result: RequestResult, done: threading.Event = done) -> None:
                order.append("urgent")
                done.set()

            eng.submit("urgent", [5, 6], GenerationParams(max_tokens=2, ignore_eos=True, priority=0), on_urgent)
            assert done.wait(30)
            deadline = time.monotonic() + 30
            while len(order) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert order == expected, policy
        finally:
            eng.stop()


def test_weight_update_between_steps_changes_logprobs_and_versions(engine: Engine) -> None:
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    try:
        name = "model.norm.weight"
        new = original[name] * 3.0
        count = engine.update_weights([(name, new)], version=7)
        assert count == 1 and engine.policy_version == 7
        res = engine.generate(PROMPTS[1], GenerationParams(max_tokens=8, seed=9, ignore_eos=True))
        seq = res.sequences[0]
        assert seq.token_policy_versions == [7] * 8
        ref = trainer_logprobs(engine.model, PROMPTS[1], seq.token_ids, 1.0)
        assert torch.allclose(torch.tensor(seq.logprobs), ref, atol=1e-4)
        with pytest.raises(KeyError, match="no counterpart"):
            engine.update_weights([("nope.weight", new)], version=8)
    finally:
        engine.update_weights(list(original.items()), version=0)
