"""The decode step as CUDA graphs (:mod:`telescope.inference.embedded.cuda_graphs`).

On the CPU: the capturable ``decode_step`` (padding rows, a column bucket wider than
the rows' lengths) gives the live rows the eager step's logits and cache writes, and
the bucket sizes. On a GPU (``-m gpu``): the engine with graphs gives the seeded
tokens of the engine without them, log-probabilities that agree with the trainer's
recomputation, and graphs that follow cache growth and in-place weight updates.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import pytest
import torch
from inference_helpers import mean_k3, trainer_logprobs

from telescope.inference.embedded.compact import CompactDecoder
from telescope.inference.embedded.cuda_graphs import MIN_COLUMNS, DecodeGraphs, bucket
from telescope.inference.embedded.engine import Engine, EngineSettings, GenerationParams, RequestResult
from telescope.inference.embedded.runners import CompactRunner

pytestmark = pytest.mark.timeout(300)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_buckets_are_powers_of_two_with_a_floor() -> None:
    assert [bucket(n) for n in (1, 2, 3, 5, 64, 65)] == [1, 2, 4, 8, 64, 128]
    assert bucket(3, MIN_COLUMNS) == MIN_COLUMNS and bucket(MIN_COLUMNS + 1, MIN_COLUMNS) == 2 * MIN_COLUMNS


def test_padded_decode_step_equals_the_eager_step(tiny_model_path: Path) -> None:
    """What a graph replays: 3 live rows padded to 4, attending 64 columns, as the eager 1-token forward."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path)).eval()
    decoder = CompactDecoder(model, max_len=128)
    prompts = [[5, 6, 7, 8, 9], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [100, 3]]
    with torch.inference_mode():
        cache = decoder.new_cache(3, 16)
        decoder.forward(cache, torch.tensor([p + [0] * (11 - len(p)) for p in prompts]), [len(p) for p in prompts])
        other = copy.deepcopy(cache)
        eager = decoder.forward(cache, torch.tensor([[11], [12], [13]]), [1, 1, 1])
        other.reserve(4, MIN_COLUMNS)
        for layer in range(len(decoder.layers)):  # stale values in the dead row and past each length
            other.keys[layer][3].fill_(7.0)
            other.keys[layer][:3, :, 11:].fill_(-5.0)
        positions = torch.tensor([5, 11, 2, 0])
        padded = decoder.decode_step(other, torch.tensor([11, 12, 13, 0]), positions, MIN_COLUMNS)
    assert padded.shape[0] == 4
    assert torch.allclose(padded[:3], eager, atol=1e-5)
    for layer in range(len(decoder.layers)):
        for row, length in enumerate([6, 12, 3]):
            assert torch.allclose(other.keys[layer][row, :, :length], cache.keys[layer][row, :, :length], atol=1e-6)
            assert torch.allclose(other.values[layer][row, :, :length], cache.values[layer][row, :, :length], atol=1e-6)


def test_graphs_need_a_cuda_device(tiny_model_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    decoder = CompactDecoder(AutoModelForCausalLM.from_pretrained(str(tiny_model_path)).eval(), max_len=64)
    with pytest.raises(ValueError, match="CUDA"):
        DecodeGraphs(decoder)
    runner = CompactRunner(decoder.model, 64, cuda_graphs=True, max_rows=8)
    assert runner.graphs is None  # on the CPU the runner decodes eagerly


def _engine(path: Path, graphs: bool, dtype: str = "float32", max_num_seqs: int = 8) -> Engine:
    settings = EngineSettings(
        model_path=str(path),
        device="cuda",
        dtype=dtype,
        max_model_len=512,
        max_num_seqs=max_num_seqs,
        forward="compact",
        cuda_graphs=graphs,
    )
    return Engine(settings).start()


@pytest.mark.gpu
@needs_cuda
def test_graphs_give_the_eager_engines_tokens_and_trainer_logprobs(tiny_model_path: Path) -> None:
    prompts = [[5, 6, 7], [40 + i for i in range(15)], [7] * 9]
    got = {}
    for graphs in (True, False):
        engine = _engine(tiny_model_path, graphs)
        try:
            runner = engine.runner
            assert isinstance(runner, CompactRunner) and (runner.graphs is not None) == graphs
            params = GenerationParams(max_tokens=80, n=2, seed=21, ignore_eos=True, temperature=0.8)
            results = [engine.generate(p, params) for p in prompts]
            got[graphs] = [[s.token_ids for s in r.sequences] for r in results]
            if graphs:
                assert runner.graphs is not None and runner.graphs.captures >= 2  # 64 then 128 columns
            cpu_model = copy.deepcopy(engine.model).cpu()
            for result in results:
                for seq in result.sequences:
                    ref = trainer_logprobs(cpu_model, result.prompt_token_ids, seq.token_ids, 0.8)
                    assert torch.allclose(torch.tensor(seq.logprobs), ref, atol=2e-3)
                    assert mean_k3(seq.logprobs, ref) < 1e-3
        finally:
            engine.stop()
    assert got[True] == got[False]


@pytest.mark.gpu
@needs_cuda
def test_graphs_follow_in_place_weight_updates_and_batch_changes(tiny_model_path: Path) -> None:
    engine = _engine(tiny_model_path, graphs=True, max_num_seqs=16)
    try:
        params = GenerationParams(max_tokens=6, seed=3, ignore_eos=True, temperature=0.0)
        before = engine.generate([5, 6, 7, 8], params).sequences[0]
        state = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
        scaled = [(name, tensor * 1.7 if tensor.dim() == 2 else tensor) for name, tensor in state.items()]
        engine.update_weights(scaled, version=1)  # copied in place: the captured graphs read the new values
        after = engine.generate([5, 6, 7, 8], params).sequences[0]
        eager = _engine(tiny_model_path, graphs=False)
        try:
            eager.update_weights(scaled, version=1)
            expected = eager.generate([5, 6, 7, 8], params).sequences[0]
        finally:
            eager.stop()
        assert after.token_ids == expected.token_ids
        assert torch.allclose(torch.tensor(after.logprobs), torch.tensor(expected.logprobs), atol=1e-4)
        assert not torch.allclose(torch.tensor(after.logprobs), torch.tensor(before.logprobs), atol=1e-2)
        # 13 requests at once: the row bucket shrinks (16, 8, 4, ...) as they finish at different lengths
        done = threading.Semaphore(0)
        results: dict[str, RequestResult] = {}

        def finish(result: RequestResult) -> None:
            results[result.request_id] = result
            done.release()

        for i in range(13):
            engine.submit(f"r{i}", [9, 10 + i], GenerationParams(max_tokens=3 + 5 * i, seed=i, ignore_eos=True), finish)
        for _ in range(13):
            assert done.acquire(timeout=120)
        cpu_model = copy.deepcopy(engine.model).cpu()
        for i in range(13):
            seq = results[f"r{i}"].sequences[0]
            assert len(seq.token_ids) == 3 + 5 * i
            ref = trainer_logprobs(cpu_model, [9, 10 + i], seq.token_ids, 1.0)
            assert torch.allclose(torch.tensor(seq.logprobs), ref, atol=2e-3)
    finally:
        engine.stop()
