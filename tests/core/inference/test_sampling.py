"""The engine's sampler (:mod:`telescope.inference.embedded.sampling`) draws exactly from the processed distribution."""

from __future__ import annotations

import math

import torch

from telescope.inference.embedded.sampling import inverse_transform, make_generator, sample


def test_frequencies_match_the_distribution_and_zero_probabilities_are_never_drawn() -> None:
    p = torch.tensor([0.5, 0.3, 0.0, 0.15, 0.05, 0.0])
    rows = 40_000
    logits = p.log().expand(rows, -1).clone()
    out = sample(logits, [1.0] * rows, [1.0] * rows, [None] * rows, generator=make_generator(7))
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=6).double()
    assert counts[2] == 0 and counts[5] == 0  # probability zero (before a nonzero entry and at the end)
    for token in (0, 1, 3, 4):
        expected = rows * float(p[token])
        sigma = math.sqrt(expected * (1 - float(p[token])))
        assert abs(counts[token] - expected) < 5 * sigma, (token, counts.tolist())
    for token, logprob in zip(out.token_ids[:50], out.logprobs[:50], strict=True):
        assert logprob == float(torch.log(p)[token].float())


def test_a_uniform_maps_to_the_token_whose_interval_holds_it() -> None:
    logp = torch.tensor([[0.25, 0.25, 0.5]]).log()
    picks = [int(inverse_transform(logp, [u])[0]) for u in (0.0, 0.2499, 0.25, 0.4999, 0.5, 0.9999999)]
    assert picks == [0, 0, 1, 1, 2, 2]


def test_seeded_rows_draw_the_same_tokens_whatever_the_batch() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    batch = sample(logits, [1.0] * 6, [1.0] * 6, [make_generator(100 + i) for i in range(6)])
    alone = [sample(logits[i : i + 1], [1.0], [1.0], [make_generator(100 + i)]).token_ids[0] for i in range(6)]
    assert batch.token_ids == alone
    reordered = sample(logits.flip(0), [1.0] * 6, [1.0] * 6, [make_generator(105 - i) for i in range(6)])
    assert reordered.token_ids[::-1] == alone
