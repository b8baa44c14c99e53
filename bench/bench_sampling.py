"""The engine's sampler per decode step, against ``torch.multinomial`` and a per-row exponential race.

Run by hand: ``python bench/bench_sampling.py [--device cpu] [--rows 64]``. For each
vocabulary size (the tiny presets' 384 and Qwen2's 151,936) it times one decode step's
sampling of ``--rows`` rows from random logits, medians of ``--repeats``:

- ``engine, seeded``: :func:`telescope.inference.embedded.sampling.sample` with a host
  RNG per row (every RL request is seeded), one uniform per row and an inverse
  transform over a float64 cumulative sum;
- ``engine, unseeded``: the same with the engine's one RNG for every row;
- ``multinomial``: ``torch.multinomial(softmax(logits), 1)`` (what ``generate``
  samples with; an exponential race over every vocabulary entry);
- ``exponential race per row``: one ``exponential_`` per row with its own
  ``torch.Generator`` (the engine's seeded sampling before, and vLLM's for seeded
  requests).

Current figures: ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from telescope.inference.embedded.sampling import make_generator, sample


def timed(function: Callable[[], object], repeats: int) -> float:
    function()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    rows = args.rows
    print(f"{rows} rows, device {args.device}, torch threads {torch.get_num_threads()}; ms per decode step (median)")
    print(
        f"{'vocabulary':>10} | {'engine, seeded':>14} | {'engine, unseeded':>16} | {'multinomial':>11} | "
        f"{'exp. race per row':>17}"
    )
    for vocab in (384, 151_936):
        figures = measure(vocab, rows, args.device, args.repeats)
        cells = " | ".join(f"{f * 1000:>{w}.2f}" for f, w in zip(figures, (14, 16, 11, 17), strict=True))
        print(f"{vocab:>10} | {cells}")


def measure(vocab: int, rows: int, device: str, repeats: int) -> list[float]:
    """Seconds per step: engine seeded, engine unseeded, multinomial, exponential race per row."""
    logits = torch.randn(rows, vocab, device=device) * 3
    ones = [1.0] * rows
    seeded = [make_generator(i) for i in range(rows)]
    shared = make_generator(0)
    torch_gens = [torch.Generator(device=device).manual_seed(i) for i in range(rows)]

    def race() -> None:
        probs = torch.softmax(logits.float(), dim=-1)
        noise = torch.empty_like(probs)
        for i, gen in enumerate(torch_gens):
            noise[i].exponential_(generator=gen)
        (probs / noise).argmax(dim=-1).tolist()

    return [
        timed(lambda: sample(logits, ones, ones, seeded), repeats),
        timed(lambda: sample(logits, ones, ones, [None] * rows, generator=shared), repeats),
        timed(lambda: torch.multinomial(torch.softmax(logits, -1), 1).tolist(), repeats),
        timed(race, repeats),
    ]


if __name__ == "__main__":
    main()
