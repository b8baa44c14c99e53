"""The load-balanced context-parallel split (telescope_megatron.context)."""

from __future__ import annotations

import pytest
import torch

from telescope_megatron.context import gathered_order, local_indices

CPU = torch.device("cpu")


def test_each_rank_keeps_one_early_and_one_late_chunk() -> None:
    assert local_indices(8, 2, 0, CPU).tolist() == [0, 1, 6, 7]
    assert local_indices(8, 2, 1, CPU).tolist() == [2, 3, 4, 5]
    assert local_indices(12, 3, 1, CPU).tolist() == [2, 3, 8, 9]


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_ranks_cover_the_row_once_with_equal_causal_work(cp: int) -> None:
    length = 8 * cp
    order = gathered_order(length, cp, CPU)
    assert sorted(order.tolist()) == list(range(length))  # a permutation: every token on exactly one rank
    # Under a causal mask query i attends to i + 1 keys: every rank gets the same number of query-key pairs.
    work = {sum(i + 1 for i in local_indices(length, cp, rank, CPU).tolist()) for rank in range(cp)}
    assert len(work) == 1
