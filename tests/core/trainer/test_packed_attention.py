"""Packed attention (SDPA per document, bucketed by length) equals transformers' masked full-row SDPA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from telescope.trainer.packed_attention import (
    ATTENTION_NAME,
    attention_compute_dtype,
    document_starts,
    length_buckets,
    register_packed_attention,
    supports,
)


def test_document_starts_follow_position_ids() -> None:
    positions = torch.tensor([0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 5, 6])  # 5 does not continue 3: a new document
    assert document_starts(positions).tolist() == [0, 3, 5, 6, 10]


def test_length_buckets_round_up_to_four_sizes_per_octave() -> None:
    lengths = torch.tensor([1, 3, 4, 5, 17, 2, 39, 40, 41, 64, 100])
    buckets = {size: idx.tolist() for size, idx in length_buckets(lengths)}
    assert buckets == {1: [0], 2: [5], 3: [1], 4: [2], 5: [3], 20: [4], 40: [6, 7], 48: [8], 64: [9], 112: [10]}
    for size, chosen in buckets.items():  # every document fits, padded by less than a quarter of its length
        assert all(int(lengths[i]) <= size < 1.25 * int(lengths[i]) + 1 for i in chosen)


def _model(path: Path, implementation: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=implementation)
    return model.eval()


def _packed_row(lengths: list[int], vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, sum(lengths)), generator=generator)
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    return ids, positions


@pytest.mark.parametrize("lengths", [[5, 9, 1, 30, 2, 17, 8], [64], [3] * 20 + [40]])
def test_logits_and_gradients_equal_masked_sdpa(tiny_model: Path, lengths: list[int]) -> None:
    reference = _model(tiny_model, "sdpa")
    packed = _model(tiny_model, register_packed_attention())
    assert packed.config._attn_implementation == ATTENTION_NAME
    ids, positions = _packed_row(lengths, reference.config.vocab_size)
    outputs = {}
    for name, model in (("sdpa", reference), ("packed", packed)):
        logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        (logits.square().mean()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        outputs[name] = (logits.detach(), grads)
    torch.testing.assert_close(outputs["packed"][0], outputs["sdpa"][0], atol=1e-5, rtol=1e-5)
    assert outputs["packed"][1].keys() == outputs["sdpa"][1].keys()
    for name, grad in outputs["sdpa"][1].items():
        torch.testing.assert_close(outputs["packed"][1][name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_each_document_sees_only_itself(tiny_model: Path) -> None:
    """A document's logits do not change when the documents packed before it do."""
    model = _model(tiny_model, register_packed_attention())
    vocab = model.config.vocab_size
    ids, positions = _packed_row([6, 11, 7], vocab, seed=1)
    other = ids.clone()
    other[0, :17] = (other[0, :17] + 1) % vocab  # change the first two documents
    with torch.no_grad():
        a = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0, 17:]
        b = model(input_ids=other, position_ids=positions, use_cache=False).logits[0, 17:]
        alone = model(input_ids=ids[:, 17:], position_ids=positions[:, 17:], use_cache=False).logits[0]
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, alone, atol=1e-5, rtol=1e-5)


def test_supports_plain_causal_models_only() -> None:
    from transformers import Qwen2Config

    assert supports(Qwen2Config(use_sliding_window=False))
    assert not supports(Qwen2Config(use_sliding_window=True, sliding_window=16, max_window_layers=0))


def test_a_rows_plan_is_reused_by_its_layers_and_never_by_another_row(tiny_model: Path) -> None:
    """Index building runs once per row (every layer and a second call on the same tensor reuse it);
    a row with other documents but the same length gets its own plan (a stale plan would mix documents)."""
    from unittest import mock

    import telescope.trainer.packed_attention as packed_attention

    reference = _model(tiny_model, "sdpa")
    packed = _model(tiny_model, register_packed_attention())
    rows = [_packed_row(lengths, reference.config.vocab_size) for lengths in ([5, 9, 1, 17], [16, 16], [32])]
    first_ids, first_positions = rows[0]
    with mock.patch.object(packed_attention, "_build_plan", wraps=packed_attention._build_plan) as built:
        for ids, positions in [*rows, (first_ids, first_positions)]:
            with torch.no_grad():
                got = packed(input_ids=ids, position_ids=positions, use_cache=False).logits
                want = reference(input_ids=ids, position_ids=positions, use_cache=False).logits
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert built.call_count == 4  # one per forward, not one per layer (the model has several)
        with torch.no_grad():
            packed(input_ids=first_ids, position_ids=first_positions, use_cache=False)
        assert built.call_count == 4  # the same position_ids tensor as the last row: its plan again
    assert reference.config.num_hidden_layers > 1


def test_half_precision_attention_runs_in_float32_on_the_cpu_only() -> None:
    for dtype in (torch.bfloat16, torch.float16):
        assert attention_compute_dtype(torch.zeros(1, dtype=dtype)) == torch.float32
        assert attention_compute_dtype(torch.zeros(1, dtype=dtype, device="meta")) == dtype  # accelerators keep it
    assert attention_compute_dtype(torch.zeros(1)) == torch.float32


def test_bfloat16_rows_attend_in_float32_and_return_bfloat16(tiny_model: Path) -> None:
    """The CPU's bfloat16 flash-attention backward is several times slower than float32's: the SDPA gets
    float32 inputs, the layer gets bfloat16 back, and logits and gradients match the masked bfloat16 SDPA."""
    from unittest import mock

    import telescope.trainer.packed_attention as packed_attention

    reference = _model(tiny_model, "sdpa").to(torch.bfloat16)
    packed = _model(tiny_model, register_packed_attention()).to(torch.bfloat16)
    ids, positions = _packed_row([5, 9, 1, 30, 2], reference.config.vocab_size)
    seen: list[torch.dtype] = []
    real_sdpa = packed_attention.F.scaled_dot_product_attention

    def recording_sdpa(q: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        seen.append(q.dtype)
        return real_sdpa(q, *args, **kwargs)  # type: ignore[arg-type]

    outputs = {}
    for name, model in (("sdpa", reference), ("packed", packed)):
        sdpa = recording_sdpa if name == "packed" else real_sdpa  # the same torch function for both models
        with mock.patch.object(packed_attention.F, "scaled_dot_product_attention", sdpa):
            logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        assert logits.dtype == torch.bfloat16
        logits.float().square().mean().backward()
        outputs[name] = (logits.detach().float(), {n: p.grad.float() for n, p in model.named_parameters()})
    assert seen and set(seen) == {torch.float32}
    torch.testing.assert_close(outputs["packed"][0], outputs["sdpa"][0], atol=0.05, rtol=0.02)
    for name, grad in outputs["sdpa"][1].items():
        torch.testing.assert_close(outputs["packed"][1][name], grad, atol=0.02, rtol=0.05, msg=name)
