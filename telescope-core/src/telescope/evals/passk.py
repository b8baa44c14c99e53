"""Unbiased pass@k and pass^k estimators (Chen et al. 2021, "Evaluating Large Language Models
Trained on Code").

For one problem with ``n`` sampled completions of which ``c`` are correct:

- ``pass@k = 1 - C(n - c, k) / C(n, k)``: the probability that at least one of ``k``
  completions drawn without replacement from the ``n`` is correct;
- ``pass^k = C(c, k) / C(n, k)``: the probability that all ``k`` drawn completions are correct.

Both are unbiased estimates of the per-problem probabilities when ``n >= k``; they are
averaged over problems. Drawing exactly ``k`` samples and checking "any of the first k" is
the biased, high-variance special case ``n = k``; sample ``n > k`` for tighter estimates.

Computation: the binomial coefficients are exact Python integers (:func:`math.comb`) and
their ratio is a correctly rounded float (``int / int``), so the result is exact up to
one rounding for any ``n`` (no overflow, no cancellation; the product form of the paper is
not needed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _validate(n: int, c: int, k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    if n < k:
        raise ValueError(f"pass@{k} needs at least k={k} samples per problem, but n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"the number of correct samples c={c} must be between 0 and n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` of the ``n`` samples (``c`` correct) is correct."""
    _validate(n, c, k)
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k: probability that all ``k`` of the ``n`` samples (``c`` correct) drawn are correct."""
    _validate(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def pass_k_metrics(correct_counts: Sequence[int], n: int | Sequence[int], ks: Sequence[int]) -> dict[str, float]:
    """Mean pass@k and pass^k over problems: ``{"pass@1": ..., "pass^1": ..., "pass@4": ...}``.

    ``correct_counts[i]`` is the number of correct samples of problem ``i``; ``n`` is the
    number of samples per problem, one int for all or one per problem (problems whose
    sampling partly failed). Every problem needs ``n >= max(ks)``. Raises ``ValueError``
    for no problems, no ``ks`` or invalid counts.
    """
    if not correct_counts:
        raise ValueError("pass@k needs at least one problem")
    if not ks:
        raise ValueError("pass@k needs at least one k")
    if isinstance(n, int):
        sample_counts = [n] * len(correct_counts)
    else:
        sample_counts = list(n)
        if len(sample_counts) != len(correct_counts):
            raise ValueError(
                f"got {len(correct_counts)} correct counts but {len(sample_counts)} sample counts; give one per problem"
            )
    metrics: dict[str, float] = {}
    for k in sorted(set(ks)):
        at_k = [pass_at_k(total, correct, k) for total, correct in zip(sample_counts, correct_counts, strict=True)]
        hat_k = [pass_hat_k(total, correct, k) for total, correct in zip(sample_counts, correct_counts, strict=True)]
        metrics[f"pass@{k}"] = math.fsum(at_k) / len(at_k)
        metrics[f"pass^{k}"] = math.fsum(hat_k) / len(hat_k)
    return metrics
