"""The engine's prefix cache: a prompt that starts with an earlier one reuses its keys and values.

Unit tests of the block index, then the engine with and without the cache: a later prompt
that extends an earlier one gets the same tokens and log-probabilities (to float
rounding) while computing only its new part, and a weight update empties the cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from telescope.inference.embedded.engine import Engine, EngineSettings, GenerationParams
from telescope.inference.embedded.prefix_cache import BLOCK, PrefixCache


def test_the_longest_whole_block_prefix_is_found_and_one_token_is_left() -> None:
    cache = PrefixCache(max_tokens=1000)
    first = list(range(40))  # two whole blocks
    cache.insert(first, lambda: "first")
    assert cache.lookup([*first, 99]) == ("first", 32)
    assert cache.lookup(first[:32]) == ("first", 16)  # never the whole prompt: its last token is computed
    assert cache.lookup([*first[:20], 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7]) == ("first", 16)
    assert cache.lookup([1, *first]) is None
    assert cache.lookup(first[:10]) is None


def test_least_recently_used_prompts_leave_first_and_copies_are_made_once() -> None:
    detached: list[str] = []

    def detach(name: str):  # type: ignore[no-untyped-def]
        return lambda: detached.append(name) or name

    cache = PrefixCache(max_tokens=3 * BLOCK)
    a, b = [1] * BLOCK, [2] * BLOCK
    cache.insert(a, detach("a"))
    cache.insert(a, detach("a again"))  # its blocks are cached: nothing copied
    cache.insert(b, detach("b"))
    assert detached == ["a", "b"]
    assert cache.lookup([*a, 0]) == ("a", BLOCK)  # a is now the most recent
    cache.insert([3] * BLOCK * 2, detach("c"))  # 4 blocks in all: b (least recent) leaves
    assert cache.lookup([*b, 0]) is None and cache.lookup([*a, 0]) is not None and cache.tokens == 3 * BLOCK
    cache.insert([4] * BLOCK, lambda: None)  # a runner that keeps no prefixes: nothing kept
    assert cache.lookup([4] * BLOCK + [0]) is None
    cache.clear()
    assert len(cache) == 0 and cache.lookup([*a, 0]) is None


@pytest.fixture(scope="module")
def engines(tiny_model_path: Path) -> Iterator[tuple[Engine, Engine]]:
    def make(tokens: int) -> Engine:
        settings = EngineSettings(model_path=str(tiny_model_path), max_model_len=512, prefix_cache_tokens=tokens)
        return Engine(settings).start()

    with_cache, without = make(4096), make(0)
    yield with_cache, without
    with_cache.stop()
    without.stop()


def test_an_extended_prompt_reuses_the_earlier_prompts_blocks_with_the_same_result(
    engines: tuple[Engine, Engine],
) -> None:
    with_cache, without = engines
    params = GenerationParams(max_tokens=8, temperature=1.0, seed=3, ignore_eos=True)
    first = [(7 * i) % 300 + 5 for i in range(40)]
    later = [*first, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    for engine in engines:
        engine.generate(first, params)
    hits = with_cache.stats["prefix_cache_hits"]
    a, b = with_cache.generate(later, params), without.generate(later, params)
    assert with_cache.stats["prefix_cache_hits"] - hits == 32  # two whole blocks of the earlier prompt
    assert without.stats["prefix_cache_hits"] == 0
    assert a.sequences[0].token_ids == b.sequences[0].token_ids
    assert torch.allclose(torch.tensor(a.sequences[0].logprobs), torch.tensor(b.sequences[0].logprobs), atol=1e-4)


def test_a_weight_update_empties_the_cache(engines: tuple[Engine, Engine]) -> None:
    with_cache, _ = engines
    prompt = list(range(5, 45))
    with_cache.generate(prompt, GenerationParams(max_tokens=1))
    assert len(with_cache.prefix_cache) > 0
    weights = [(name, tensor.detach().clone()) for name, tensor in with_cache.model.state_dict().items()][:1]
    with_cache.update_weights(weights, version=with_cache.policy_version + 1)
    assert len(with_cache.prefix_cache) == 0
    hits = with_cache.stats["prefix_cache_hits"]
    with_cache.generate([*prompt, 1], GenerationParams(max_tokens=1))
    assert with_cache.stats["prefix_cache_hits"] == hits  # nothing reused from the old weights
