"""Prompt KV kept across requests: a later prompt that starts with an earlier one skips that part's prefill.

An agent's later calls send its earlier calls' prompts again with more after them, and
every episode of a run starts with the same system prompt and tools. The engine keeps the
keys and values of each prompt it prefilled (:meth:`PrefixCache.insert`) and, when a
request is admitted, looks for the longest cached prefix of its prompt
(:meth:`PrefixCache.lookup`): the request's prefill then starts from a copy of those keys
and values and computes only the rest, as a chunked prefill continues (the logits are
those of a whole prefill up to float rounding). Reused tokens count in the engine's
``prefix_cache_hits`` (vLLM's name).

Matching is by blocks of :data:`BLOCK` tokens, as vLLM's: each cached prompt is indexed by
the hash chain of its whole blocks, so a lookup walks the new prompt's blocks and stops at
the first one no cached prompt shares. A reuse is whole blocks only, and always leaves at
least one token to compute (the last token's logits are needed to sample).

Memory: each entry holds its own copy of one prompt's keys and values; the cache holds at
most ``max_tokens`` tokens in all, dropping the least recently used entries. Weights
change the keys and values, so the engine clears the cache at every weight update.

Limit: only the compact forward's runner keeps prefixes (:meth:`BatchRunner.detach_prefix`
of the Hugging Face fallback returns None, and nothing is cached).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: Tokens per block: the unit of matching and of reuse.
BLOCK = 16


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    stored: Any  # the runner's own copy of the prompt's keys and values
    hashes: list[int]


def block_hashes(tokens: Sequence[int]) -> list[int]:
    """The hash chain of ``tokens``' whole blocks: entry ``k`` names the first ``(k + 1) * BLOCK`` tokens."""
    out: list[int] = []
    previous = 0
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        previous = hash((previous, tuple(tokens[start : start + BLOCK])))
        out.append(previous)
    return out


class PrefixCache:
    """Prompts' keys and values by block hash, least recently used dropped first (module docstring)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.tokens = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[int, tuple[int, int]] = {}  # block hash -> (entry id, blocks)
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: Sequence[int]) -> tuple[Any, int] | None:
        """The stored keys and values sharing the longest whole-block prefix with ``prompt``, and its length."""
        best: tuple[int, int] | None = None
        for blocks, digest in enumerate(block_hashes(prompt), start=1):
            if blocks * BLOCK >= len(prompt):  # leave at least one token to compute
                break
            found = self._index.get(digest)
            if found is None:
                break
            entry_id, _ = found
            entry = self._entries.get(entry_id)
            if entry is None or tuple(prompt[: blocks * BLOCK]) != entry.tokens[: blocks * BLOCK]:
                break  # dropped meanwhile, or a hash collision
            best = (entry_id, blocks * BLOCK)
        if best is None:
            return None
        entry_id, length = best
        self._entries.move_to_end(entry_id)
        return self._entries[entry_id].stored, length

    def insert(self, prompt: Sequence[int], detach: Callable[[], Any]) -> None:
        """Keep ``detach()`` (a copy of ``prompt``'s keys and values) for later prompts that start with it.

        ``detach`` is called only when the prompt is kept: not when its whole blocks are
        cached already, nor when it returns None (a runner that keeps no prefixes).
        """
        if self.max_tokens <= 0 or len(prompt) < BLOCK or len(prompt) > self.max_tokens:
            return
        hashes = block_hashes(prompt)
        if hashes and hashes[-1] in self._index:
            entry_id, blocks = self._index[hashes[-1]]
            if blocks == len(hashes) and entry_id in self._entries:
                self._entries.move_to_end(entry_id)  # its whole blocks are cached already
                return
        stored = detach()
        if stored is None:
            return
        entry_id, self._next_id = self._next_id, self._next_id + 1
        self._entries[entry_id] = _Entry(tuple(prompt), stored, hashes)
        for blocks, digest in enumerate(hashes, start=1):
            self._index[digest] = (entry_id, blocks)
        self.tokens += len(prompt)
        while self.tokens > self.max_tokens and self._entries:
            self._drop(next(iter(self._entries)))

    def _drop(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        self.tokens -= len(entry.tokens)
        for digest in entry.hashes:
            if self._index.get(digest, (None, 0))[0] == entry_id:
                del self._index[digest]

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self.tokens = 0
