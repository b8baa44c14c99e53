"""The compact decode step as CUDA graphs, one per (rows, columns) bucket.

Why
---
A decode step of a small model on a GPU is bound by kernel launches, not by the
GPU: a 24-layer model launches a few hundred kernels per step, each costing the
host microseconds of Python and driver time while the GPU finishes it in less.
A CUDA graph records a step's kernels once and replays them with one launch.

Design
------
:meth:`~.compact.CompactDecoder.decode_step` is written to be capturable: tensors
in, tensors out, shapes fixed by the number of rows and the number of cache
columns it attends, no host synchronisation. :class:`DecodeGraphs` keeps one graph
per bucket:

- rows round up to a power of two (at least 1), columns to a power of two (at
  least :data:`MIN_COLUMNS`, at most the model length); a step copies its tokens
  and positions into the bucket's input buffers, zeroes the padding rows, replays
  and returns the first ``rows`` rows of the bucket's logits buffer (valid until
  the next replay);
- padding rows write their keys and values at column 0 of cache rows past the live
  ones (dead rows: :class:`~.compact.SlotCache` never reads them before writing)
  and attend only to it; a masked column's score is ``-inf`` exactly as in the
  eager step, so a live row's logits are the eager step's up to the rounding of
  a different batch shape;
- a graph is captured on first use of its bucket (two warm-up runs on a side
  stream first, as CUDA's capture rules need), with ``thread_local`` capture
  so a weight transfer on another thread may use the GPU meanwhile;
- a graph reads the addresses it was captured with: when the cache reallocates
  (it grows geometrically; :class:`~.compact.SlotCache` ``reserve``) or a weight
  update replaces a tensor instead of copying into it, every graph is dropped and
  re-captured on demand. The cache is checked at each step (two integers); the
  weights only when the runner reports an update (:meth:`DecodeGraphs.weights_updated`),
  the one way they move. The runner reserves the cache's rows for
  ``max_num_seqs`` up front, so in a steady run the graphs are captured once per
  column bucket.

Limits
------
CUDA only (the CPU runs the same ``decode_step`` eagerly). Prefill stays eager (its
shapes vary with the prompts). Each graph holds its own memory pool: the logits
buffer (``rows x vocabulary``) and the step's activations; a bucket count of
``log2(max_num_seqs) x log2(max_model_len / 64)`` at most.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from telescope.inference.embedded.compact import CompactDecoder, SlotCache

log = logging.getLogger(__name__)

#: the fewest cache columns a graph attends (short sequences share one graph)
MIN_COLUMNS = 64


def bucket(n: int, minimum: int = 1) -> int:
    """The smallest power of two that is at least ``n`` and ``minimum``."""
    size = max(1, minimum)
    while size < n:
        size *= 2
    return size


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    ids: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor


class DecodeGraphs:
    """Captured decode steps of one :class:`~.compact.CompactDecoder` (see the module doc)."""

    def __init__(self, decoder: CompactDecoder) -> None:
        if decoder.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {decoder.device}")
        self.decoder = decoder
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self._cache_at: tuple[int, int] = (0, 0)  # the cache the graphs were captured over
        self._weights_at = decoder.weight_addresses()
        self.captures = 0  # graphs captured so far (re-captures included), for tests and logs

    def columns_for(self, end: int) -> int:
        """The column bucket for a step whose longest row reaches ``end`` columns."""
        limit = max(self.decoder.max_len, end)
        return min(bucket(end, MIN_COLUMNS), limit)

    def decode(self, cache: SlotCache, tokens: list[int]) -> torch.Tensor:
        """One decode step of the cache's first ``len(tokens)`` rows; logits ``[rows, vocab]``.

        Advances the rows' lengths by one, as :meth:`CompactDecoder.forward` does.
        """
        rows = len(tokens)
        lengths = cache.lengths[:rows]
        padded_rows = bucket(rows)
        columns = self.columns_for(max(lengths) + 1)
        cache.reserve(padded_rows, columns)
        self._drop_stale(cache)
        graph = self.graphs.get((padded_rows, columns))
        device = self.decoder.device
        ids = torch.tensor(tokens, device=device)
        positions = torch.tensor(lengths, device=device)
        if graph is None:
            graph = self._capture(cache, padded_rows, columns, ids, positions)
        else:
            self._load(graph, ids, positions)
            graph.graph.replay()
        for r in range(rows):
            cache.lengths[r] += 1
        return graph.logits[:rows]

    def clear(self) -> None:
        self.graphs.clear()

    # ------------------------------------------------------------------ internals
    def weights_updated(self) -> None:
        """After a weight update: drop every graph if a weight tensor moved (an in-place copy keeps them)."""
        addresses = self.decoder.weight_addresses()
        if addresses != self._weights_at:
            log.debug("embedded engine: weights moved; re-capturing %d graphs", len(self.graphs))
            self.graphs.clear()
            self._weights_at = addresses

    def _drop_stale(self, cache: SlotCache) -> None:
        """Drop every graph if the cache reallocated (or is another one) since they were captured."""
        at = (id(cache), cache.keys[0].data_ptr())
        if at != self._cache_at:
            if self.graphs:
                log.debug("embedded engine: the cache moved; re-capturing %d graphs", len(self.graphs))
            self.graphs.clear()
            self._cache_at = at

    @staticmethod
    def _load(graph: _Graph, ids: torch.Tensor, positions: torch.Tensor) -> None:
        rows = ids.shape[0]
        graph.ids[:rows].copy_(ids)
        graph.positions[:rows].copy_(positions)
        if rows < graph.ids.shape[0]:
            graph.ids[rows:].zero_()
            graph.positions[rows:].zero_()

    def _capture(self, cache: SlotCache, rows: int, columns: int, ids: torch.Tensor, positions: torch.Tensor) -> _Graph:
        device = self.decoder.device
        static_ids = torch.zeros(rows, dtype=torch.long, device=device)
        static_positions = torch.zeros(rows, dtype=torch.long, device=device)
        placeholder = _Graph(torch.cuda.CUDAGraph(), static_ids, static_positions, static_ids)
        self._load(placeholder, ids, positions)
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up: the real inputs, so the cache writes are the real ones
            for _ in range(2):
                self.decoder.decode_step(cache, static_ids, static_positions, columns)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            logits = self.decoder.decode_step(cache, static_ids, static_positions, columns)
        graph.replay()
        entry = _Graph(graph, static_ids, static_positions, logits)
        self.graphs[(rows, columns)] = entry
        self.captures += 1
        return entry


__all__ = ["MIN_COLUMNS", "DecodeGraphs", "bucket"]
