"""The prompt stream: every usable sample once per epoch, in a seeded order shuffled once per epoch."""

from __future__ import annotations

import random
from typing import Any

import pytest

from telescope.api.records import Sample
from telescope.orchestrator.prompts import EnvironmentSlot, PromptSource


def source(num_samples: int, **kwargs: Any) -> PromptSource:
    samples = [Sample(prompt=f"p{i}", sample_id=str(i)) for i in range(num_samples)]
    slot = EnvironmentSlot(index=0, name="toy", environment=object(), samples=samples)  # type: ignore[arg-type]
    kwargs = {"prefetch": False, **kwargs}
    return PromptSource([slot], lambda _slot, sample: ([], [len(str(sample.prompt))]), seed=7, **kwargs)


def test_each_epoch_is_one_shuffle_of_every_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    shuffles = []
    real_shuffle = random.Random.shuffle

    def counted(self: random.Random, x: list[Any]) -> None:
        shuffles.append(len(x))
        real_shuffle(self, x)

    monkeypatch.setattr(random.Random, "shuffle", counted)
    prompts = source(50)
    drawn = [prompts.next().sample.sample_id for _ in range(120)]
    # before the fix the whole dataset was shuffled again for every prompt (120 shuffles)
    assert shuffles == [50, 50, 50]
    for epoch in range(2):
        assert sorted(drawn[50 * epoch : 50 * (epoch + 1)], key=int) == [str(i) for i in range(50)]
    assert drawn[:50] != drawn[50:100]  # each epoch has its own order


def test_a_restored_stream_continues_mid_epoch_with_the_same_order() -> None:
    first = source(30)
    for _ in range(17):
        first.next()
    state = first.state_dict()
    expected = [first.next().sample.sample_id for _ in range(40)]
    restored = source(30)
    restored.load_state_dict(state)
    assert [restored.next().sample.sample_id for _ in range(40)] == expected


def test_next_ready_takes_prefetched_prompts_in_the_same_order_and_state() -> None:
    import time

    expected_source = source(20)
    expected = [expected_source.next().sample.sample_id for _ in range(12)]
    prefetched = source(20, prefetch=True, prefetch_size=4)
    assert prefetched.next_ready() is None  # nothing prefetched before the first next()
    drawn = [prefetched.next().sample.sample_id]
    while len(drawn) < 12:
        item = prefetched.next_ready()
        if item is None:
            time.sleep(0.01)  # the prefetch thread is still rendering
            continue
        drawn.append(item.sample.sample_id)
    assert drawn == expected
    state = prefetched.state_dict()
    prefetched.close()
    assert state["draw"] == 12  # the position after the last prompt taken, as with next()
    assert source(20).next_ready() is None  # no prefetching: always next()
