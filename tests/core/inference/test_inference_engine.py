"""The embedded engine without HTTP: log-probability correctness, sampling, batching, scheduling."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from inference_helpers import mean_k3, trainer_logprobs, with_forward

from telescope.inference.embedded.engine import Engine, EngineSettings, GenerationParams, RequestResult
from telescope.inference.embedded.sampling import make_generator, sample

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


def nucleus_logprobs(
    model: torch.nn.Module, prompt: list[int], completion: list[int], temperature: float, top_p: float
) -> tuple[list[float], list[bool]]:
    """log(p_i / nucleus mass) of each completion token, and whether it lies in the nucleus (float64).

    The nucleus of a position is the smallest set of most likely tokens whose mass reaches ``top_p``.
    """
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = with_forward(model)(input_ids=ids).logits[0].double()
    probs = torch.softmax(logits / temperature, dim=-1)[len(prompt) - 1 : -1]
    values: list[float] = []
    inside: list[bool] = []
    for row, token in zip(probs.tolist(), completion, strict=True):
        order = sorted(range(len(row)), key=lambda i: -row[i])
        nucleus, mass = set(), 0.0
        for i in order:
            nucleus.add(i)
            mass += row[i]
            if mass >= top_p:
                break
        values.append(math.log(row[token] / mass))
        inside.append(token in nucleus)
    return values, inside


def test_logprobs_with_top_p_describe_the_truncated_nucleus(engine: Engine) -> None:
    """With top_p set the engine reports log(p_i / nucleus mass), as vLLM's processed_logprobs."""
    params = GenerationParams(max_tokens=16, temperature=0.8, top_p=0.5, seed=3, ignore_eos=True)
    result = engine.generate(PROMPTS[1], params)
    seq = result.sequences[0]
    expected, inside = nucleus_logprobs(engine.model, PROMPTS[1], seq.token_ids, 0.8, 0.5)
    assert all(inside)
    assert seq.logprobs == pytest.approx(expected, abs=1e-4)
    untruncated = trainer_logprobs(engine.model, PROMPTS[1], seq.token_ids, 0.8)
    assert float((torch.tensor(seq.logprobs) - untruncated).max()) > 1e-2  # the truncation is visible


def test_sample_reports_the_renormalised_nucleus() -> None:
    """p = [0.5, 0.3, 0.15, 0.05], top_p = 0.7: nucleus {0, 1} of mass 0.8, so log(0.625) and log(0.375).

    A greedy row in the same batch ignores top_p and reports the unscaled log_softmax (log 0.5), as vLLM.
    """
    p = [0.5, 0.3, 0.15, 0.05]
    rows = 64
    logits = torch.tensor([p] * rows).log()
    temperatures = [1.0] * (rows - 1) + [0.0]
    gens = [make_generator(1000 + i) for i in range(rows)]
    out = sample(logits, temperatures, [0.7] * rows, gens, num_top=3)
    expected = {0: math.log(0.5 / 0.8), 1: math.log(0.3 / 0.8)}
    assert set(out.token_ids[:-1]) == {0, 1}
    for token, logprob in zip(out.token_ids[:-1], out.logprobs[:-1], strict=True):
        assert logprob == pytest.approx(expected[token], abs=1e-6)
    assert out.top_ids is not None and out.top_logprobs is not None
    assert out.top_ids[0][:2] == [0, 1]
    assert out.top_logprobs[0][:2] == pytest.approx([expected[0], expected[1]], abs=1e-6)
    assert out.top_logprobs[0][2] == float("-inf")
    assert out.token_ids[-1] == 0 and out.logprobs[-1] == pytest.approx(math.log(0.5), abs=1e-6)


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


def test_a_streamed_update_that_fails_part_way_holds_the_engine_until_a_whole_version_loads(engine: Engine) -> None:
    """Half of a streamed version is loaded when its sender fails: no step may run on that mix of versions."""
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    names = list(original)[:2]

    def failing() -> Iterator[tuple[str, torch.Tensor]]:
        yield names[0], original[names[0]] * 2.0
        raise TimeoutError("the sender stopped writing weights version 5 after 1 of 2 tensors")

    try:
        with pytest.raises(TimeoutError, match="after 1 of 2"):
            engine.update_weights(failing(), version=5, streamed=True)
        assert engine.policy_version != 5
        done = threading.Event()
        engine.submit("waits", PROMPTS[0], GenerationParams(max_tokens=2, ignore_eos=True), lambda _: done.set())
        assert not done.wait(0.5)  # held: the request waits
        engine.update_weights(iter(list(original.items())), version=6, streamed=True)
        assert done.wait(30) and engine.policy_version == 6  # a whole version loaded: the engine runs again
    finally:
        engine.update_weights(list(original.items()), version=0)


def _collect(engine: Engine, requests: dict[str, tuple[list[int], GenerationParams]]) -> dict[str, RequestResult]:
    """Submit ``requests`` while the engine is held, so one step admits them all; their results."""
    results: dict[str, RequestResult] = {}
    done = threading.Event()

    def on_done(result: RequestResult) -> None:
        results[result.request_id] = result
        if len(results) == len(requests):
            done.set()

    with engine.paused():
        for request_id, (prompt, params) in requests.items():
            engine.submit(request_id, prompt, params, on_done)
    assert done.wait(60)
    return results


def test_identical_prompts_admitted_together_share_one_prefill(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group's samples sent as separate requests: one prefill row, the same tokens as each alone."""
    prompt, other = [9, 8, 7, 6, 5, 4], [30, 31, 32]
    params = {f"g{i}": GenerationParams(max_tokens=10, seed=100 + i, ignore_eos=True) for i in range(4)}
    alone = {rid: engine.generate(prompt, p).sequences[0].token_ids for rid, p in params.items()}
    rows: list[int] = []
    prefill = engine.runner.prefill

    def counting(chunks: list[tuple[list[int], object]]) -> object:
        rows.append(len(chunks))
        return prefill(chunks)

    monkeypatch.setattr(engine.runner, "prefill", counting)
    hits = engine.counts()["prefix_cache_hits"]
    requests = {rid: (prompt, p) for rid, p in params.items()}
    requests["other"] = (other, GenerationParams(max_tokens=10, seed=7, ignore_eos=True))
    results = _collect(engine, requests)
    assert rows == [2]  # the four identical prompts and the other one
    assert engine.counts()["prefix_cache_hits"] - hits == 3 * len(prompt)
    for rid, tokens in alone.items():
        assert results[rid].sequences[0].token_ids == tokens
    assert len({tuple(r.sequences[0].token_ids) for r in results.values()}) == 5  # own seeds, own samples


def test_a_request_aborted_while_its_shared_prefill_joins_leaves_the_others(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = [11, 12, 13, 14]
    params = {f"j{i}": GenerationParams(max_tokens=8, seed=200 + i, ignore_eos=True) for i in range(3)}
    alone = {rid: engine.generate(prompt, p).sequences[0].token_ids for rid, p in params.items()}
    prefill = engine.runner.prefill

    def then_abort(chunks: list[tuple[list[int], object]]) -> object:
        out = prefill(chunks)
        engine.abort("j1")  # after the shared prefill, before the samples join the batch
        return out

    monkeypatch.setattr(engine.runner, "prefill", then_abort)
    results = _collect(engine, {rid: (prompt, p) for rid, p in params.items()})
    assert results["j1"].sequences[0].finish_reason == "abort"
    assert results["j0"].sequences[0].token_ids == alone["j0"]
    assert results["j2"].sequences[0].token_ids == alone["j2"]
