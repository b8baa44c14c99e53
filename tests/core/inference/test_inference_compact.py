"""The compact decoder forward (:mod:`telescope.inference.embedded.compact`) and the runner choice.

The compact forward must give Hugging Face's logits (several prompts prefilled together,
a chunked prompt continued, decode steps, rows leaving), follow in-place weight
updates, and the engine must give the same seeded tokens and trainer-agreeing
log-probabilities with either runner.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from inference_helpers import mean_k3, trainer_logprobs

from telescope.inference.embedded.compact import CompactDecoder, unsupported_reason
from telescope.inference.embedded.engine import Engine, EngineSettings, GenerationParams
from telescope.inference.embedded.runners import CompactRunner, HFRunner, make_runner

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def model(tiny_model_path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_path)).eval()


def hf_last_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def test_compact_forward_matches_hugging_face(model: torch.nn.Module) -> None:
    decoder = CompactDecoder(model, max_len=128)
    prompts = [[5, 6, 7, 8, 9], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [100, 3]]
    with torch.inference_mode():
        cache = decoder.new_cache(3, 4)  # grows while prefilling
        ids = torch.tensor([p + [0] * (11 - len(p)) for p in prompts])
        logits = decoder.forward(cache, ids, [len(p) for p in prompts])
        for row, prompt in enumerate(prompts):
            assert torch.allclose(logits[row], hf_last_logits(model, prompt), atol=1e-5)
        logits = decoder.forward(cache, torch.tensor([[11], [12], [13]]), [1, 1, 1])
        for row, (prompt, token) in enumerate(zip(prompts, [11, 12, 13], strict=True)):
            assert torch.allclose(logits[row], hf_last_logits(model, [*prompt, token]), atol=1e-5)
        order = cache.keep([0, 2])  # row 1 leaves: the last row takes its place
        assert order == [0, 2] and cache.lengths == [6, 3]
        # different run lengths per row: a chunk after row 0, one token after row 1
        logits = decoder.forward(cache, torch.tensor([[20, 21, 22], [23, 0, 0]]), [3, 1])
        assert torch.allclose(logits[0], hf_last_logits(model, prompts[0] + [11, 20, 21, 22]), atol=1e-5)
        assert torch.allclose(logits[1], hf_last_logits(model, prompts[2] + [13, 23]), atol=1e-5)


def test_compact_weights_follow_updates(model: torch.nn.Module) -> None:
    decoder = CompactDecoder(model, max_len=64)
    q = model.model.layers[0].self_attn.q_proj.weight
    original = q.detach().clone()
    try:
        with torch.no_grad():
            q.data.copy_(original * 2)  # in place (what load_named_tensors does): the fused view sees it
        assert torch.equal(decoder.qkv[0][: q.shape[0]], original * 2)
        with torch.no_grad():
            q.data = original * 3  # storage replaced: refresh re-fuses
        decoder.refresh()
        assert torch.equal(decoder.qkv[0][: q.shape[0]], original * 3)
        with torch.inference_mode():
            cache = decoder.new_cache(1, 8)
            logits = decoder.forward(cache, torch.tensor([[5, 6, 7]]), [3])
        assert torch.allclose(logits[0], hf_last_logits(model, [5, 6, 7]), atol=1e-5)
    finally:
        with torch.no_grad():
            q.data.copy_(original)


def test_unsupported_models_fall_back_to_hugging_face() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64)).eval()
    assert "gpt2" in (unsupported_reason(gpt2) or "")
    assert isinstance(make_runner(gpt2, 64), HFRunner)
    with pytest.raises(ValueError, match="does not support"):
        make_runner(gpt2, 64, forward="compact")


def test_both_runners_give_the_same_seeded_tokens(tiny_model_path: Path) -> None:
    prompts = [[5, 6, 7], [40 + i for i in range(15)], [7] * 9]
    got = {}
    for forward in ("compact", "hf"):
        engine = Engine(
            EngineSettings(model_path=str(tiny_model_path), max_model_len=256, max_num_seqs=8, forward=forward)
        ).start()
        try:
            runner = engine.runner
            assert isinstance(runner, CompactRunner if forward == "compact" else HFRunner)
            params = GenerationParams(max_tokens=16, n=2, seed=21, ignore_eos=True, temperature=0.8)
            results = [engine.generate(p, params) for p in prompts]
            got[forward] = [[s.token_ids for s in r.sequences] for r in results]
            for result in results:
                for seq in result.sequences:
                    ref = trainer_logprobs(engine.model, result.prompt_token_ids, seq.token_ids, 0.8)
                    assert torch.allclose(torch.tensor(seq.logprobs), ref, atol=1e-4)
                    assert mean_k3(seq.logprobs, ref) < 1e-3
        finally:
            engine.stop()
    assert got["compact"] == got["hf"]


def test_seeded_rows_keep_their_draws_next_to_unseeded_rows() -> None:
    """Unseeded rows share one batched draw; seeded rows still draw from their own generators."""
    from telescope.inference.embedded.sampling import make_generator, sample

    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    mixed = sample(
        logits, [1.0] * 4, [1.0] * 4, [make_generator(1), None, make_generator(2), None], generator=make_generator(9)
    )
    alone = [sample(logits[i : i + 1], [1.0], [1.0], [make_generator(s)]) for i, s in ((0, 1), (2, 2))]
    assert [mixed.token_ids[0], mixed.token_ids[2]] == [a.token_ids[0] for a in alone]
    logp = torch.log_softmax(logits, dim=-1)
    for i, token in enumerate(mixed.token_ids):
        assert mixed.logprobs[i] == pytest.approx(float(logp[i, token]), abs=1e-6)
    shared = sample(logits, [1.0] * 4, [1.0] * 4, [None] * 4, generator=make_generator(9))
    again = sample(logits, [1.0] * 4, [1.0] * 4, [None] * 4, generator=make_generator(9))
    assert shared.token_ids == again.token_ids  # the engine's generator makes unseeded runs reproducible
