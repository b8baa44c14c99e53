"""The engine's batch state and model calls: one interface, two implementations.

The engine (:mod:`.engine`) decides *what* runs in a step (which prompt chunks are
prefilled, which sequences decode); a :class:`BatchRunner` holds the running
batch's KV cache and runs the model:

- :meth:`BatchRunner.prefill` feeds prompt chunks, each continuing its own prefill
  state (``None`` for a prompt's first chunk), and returns each chunk's last-token
  logits and the new states;
- :meth:`BatchRunner.join` appends ``count`` copies of a finished prefill state to
  the running batch (a request's ``n`` samples share one prefill);
- :meth:`BatchRunner.decode` feeds one token per running row, in row order;
- :meth:`BatchRunner.keep` keeps some rows and returns their new order (a runner
  may reorder rows to avoid copies; the engine reorders its sequences to match);
- :meth:`BatchRunner.detach_prefix` copies a finished prefill's first ``length``
  tokens of keys and values out (for :mod:`.prefix_cache`; None where the runner
  keeps no prefixes), and :meth:`BatchRunner.prefix_state` makes such a copy's first
  ``length`` tokens the state a prompt's prefill continues from.

:class:`CompactRunner` (the default where :func:`.compact.unsupported_reason` allows)
runs the compact forward over a preallocated :class:`~.compact.SlotCache`: all
chunks of a step in one right-padded forward, decode appends in place, a leaving
row's place is taken by the last row. :class:`HFRunner` is the fallback for every
other causal LM: Hugging Face's forward and ``DynamicCache``, one forward per
prompt chunk, the batch *left*-padded to a common length with an attention mask and
explicit position ids, columns that are padding in every row trimmed when rows
leave. Both give a sequence the logits it would get alone, up to float rounding.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from telescope.inference.embedded.compact import CompactDecoder, SlotCache, unsupported_reason
from telescope.inference.embedded.cuda_graphs import DecodeGraphs, bucket

log = logging.getLogger(__name__)


class BatchRunner(Protocol):
    name: str

    def prefill(self, chunks: list[tuple[list[int], Any]]) -> tuple[torch.Tensor, list[Any]]: ...

    def join(self, state: Any, count: int) -> None: ...

    def decode(self, tokens: list[int]) -> torch.Tensor: ...

    def keep(self, keep: list[int]) -> list[int]: ...

    def clear(self) -> None: ...

    def weights_updated(self) -> None: ...

    def detach_prefix(self, state: Any, length: int) -> Any | None: ...

    def prefix_state(self, stored: Any, length: int) -> Any: ...


def make_runner(
    model: Any, max_len: int, forward: str = "auto", cuda_graphs: bool = True, max_rows: int = 0
) -> BatchRunner:
    """The compact runner where the model is supported (``forward="auto"``), else the Hugging Face one.

    ``cuda_graphs``: on a CUDA device, the compact runner replays its decode step as
    CUDA graphs (:mod:`.cuda_graphs`); ``max_rows`` (the engine's ``max_num_seqs``)
    is then reserved in its cache up front so the graphs are not re-captured as the
    batch grows.
    """
    if forward == "hf":
        return HFRunner(model)
    reason = unsupported_reason(model)
    if reason is None:
        return CompactRunner(model, max_len, cuda_graphs=cuda_graphs, max_rows=max_rows)
    if forward == "compact":
        raise ValueError(f"forward='compact' but the compact forward does not support this model: {reason}")
    log.info("embedded engine: Hugging Face forward (%s)", reason)
    return HFRunner(model)


class CompactRunner:
    """The running batch in one :class:`SlotCache`, driven by :class:`CompactDecoder`."""

    name = "compact"

    def __init__(self, model: Any, max_len: int, cuda_graphs: bool = True, max_rows: int = 0) -> None:
        self.decoder = CompactDecoder(model, max_len)
        self.device = self.decoder.device
        self.graphs = DecodeGraphs(self.decoder) if cuda_graphs and self.device.type == "cuda" else None
        self.cache = self.decoder.new_cache(0, 64)
        if self.graphs is not None and max_rows > 0:
            self.cache.reserve(bucket(max_rows), 64)

    def prefill(self, chunks: list[tuple[list[int], Any]]) -> tuple[torch.Tensor, list[Any]]:
        """All chunks in one forward; a state is ``(cache, row)`` of the step's prefill cache."""
        rows = len(chunks)
        width = max(len(tokens) for tokens, _ in chunks)
        starts = [0 if state is None else state[0].lengths[state[1]] for _, state in chunks]
        cache = self.decoder.new_cache(rows, max(s + len(t) for s, (t, _) in zip(starts, chunks, strict=True)))
        for row, (_, state) in enumerate(chunks):
            if state is not None:  # a chunked prompt continues: copy its keys and values so far
                source, at = state
                length = source.lengths[at]
                for dst, src in zip(cache.keys + cache.values, source.keys + source.values, strict=True):
                    dst[row, :, :length] = src[at, :, :length]
                cache.lengths[row] = length
        padded = [tokens + [0] * (width - len(tokens)) for tokens, _ in chunks]
        ids = torch.tensor(padded, device=self.device)
        logits = self.decoder.forward(cache, ids, [len(tokens) for tokens, _ in chunks])
        return logits, [(cache, row) for row in range(rows)]

    def join(self, state: Any, count: int) -> None:
        source, row = state
        self.cache.append_rows(source, row, count)

    def decode(self, tokens: list[int]) -> torch.Tensor:
        if self.graphs is not None:
            return self.graphs.decode(self.cache, tokens)
        ids = torch.tensor(tokens, device=self.device).unsqueeze(1)
        return self.decoder.forward(self.cache, ids, [1] * len(tokens))

    def keep(self, keep: list[int]) -> list[int]:
        return self.cache.keep(keep)

    def clear(self) -> None:
        self.cache.keep([])

    def weights_updated(self) -> None:
        self.decoder.refresh()
        if self.graphs is not None:
            self.graphs.weights_updated()

    def detach_prefix(self, state: Any, length: int) -> PrefixKV:
        source, row = state
        keys = [k[row : row + 1, :, :length].clone() for k in source.keys]
        values = [v[row : row + 1, :, :length].clone() for v in source.values]
        return PrefixKV(keys, values, [length])

    def prefix_state(self, stored: Any, length: int) -> Any:
        return PrefixKV(stored.keys, stored.values, [length]), 0


class PrefixKV:
    """One prompt's keys and values, shaped as a one-row :class:`SlotCache` to continue a prefill from."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], lengths: list[int]) -> None:
        self.keys, self.values, self.lengths = keys, values, lengths


class HFRunner:
    """Hugging Face's forward over one left-padded ``DynamicCache`` (the fallback; see the module doc)."""

    name = "hf"

    def __init__(self, model: Any) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.cache: Any = None
        self.pads: list[int] = []

    def prefill(self, chunks: list[tuple[list[int], Any]]) -> tuple[torch.Tensor, list[Any]]:
        """One forward per chunk; a state is the prompt's own ``DynamicCache``."""
        logits, states = [], []
        for tokens, state in chunks:
            ids = torch.tensor([tokens], device=self.device)
            out = self.model(input_ids=ids, past_key_values=state, use_cache=True)
            for layer in out.past_key_values.layers:
                if type(layer).__name__ != "DynamicLayer":
                    raise RuntimeError(f"the embedded engine supports full-attention caches only, not {type(layer)}")
            logits.append(out.logits[0, -1])
            states.append(out.past_key_values)
        return torch.stack(logits), states

    def join(self, state: Any, count: int) -> None:
        length = state.layers[0].keys.shape[2]
        keys = [(layer.keys.repeat(count, 1, 1, 1), layer.values.repeat(count, 1, 1, 1)) for layer in state.layers]
        if self.cache is None:
            for layer, (k, v) in zip(state.layers, keys, strict=True):
                layer.keys, layer.values = k, v
            self.cache, self.pads = state, [0] * count
            return
        cur = self.cache.layers[0].keys.shape[2]
        total = max(cur, length)
        for old, (nk, nv) in zip(self.cache.layers, keys, strict=True):
            ok, ov = old.keys, old.values
            if cur < total:
                ok, ov = F.pad(ok, (0, 0, total - cur, 0)), F.pad(ov, (0, 0, total - cur, 0))
            if length < total:
                nk, nv = F.pad(nk, (0, 0, total - length, 0)), F.pad(nv, (0, 0, total - length, 0))
            old.keys, old.values = torch.cat([ok, nk]), torch.cat([ov, nv])
        self.pads = [p + total - cur for p in self.pads] + [total - length] * count

    def detach_prefix(self, state: Any, length: int) -> None:
        return None  # prefixes are kept by the compact runner only

    def prefix_state(self, stored: Any, length: int) -> Any:
        raise NotImplementedError("the Hugging Face runner keeps no prefixes")

    def decode(self, tokens: list[int]) -> torch.Tensor:
        length = self.cache.layers[0].keys.shape[2]
        pads = torch.tensor(self.pads, device=self.device)
        ids = torch.tensor(tokens, device=self.device).unsqueeze(1)
        positions = (length - pads).unsqueeze(1)
        mask = (torch.arange(length + 1, device=self.device).unsqueeze(0) >= pads.unsqueeze(1)).long()
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=self.cache, use_cache=True
        )
        self.cache = out.past_key_values
        return out.logits[:, -1]

    def keep(self, keep: list[int]) -> list[int]:
        if len(keep) == len(self.pads):
            return keep
        if not keep:
            self.clear()
            return []
        index = torch.tensor(keep, device=self.device)
        pads = [self.pads[i] for i in keep]
        trim = min(pads)
        for layer in self.cache.layers:
            layer.keys = layer.keys[index, :, trim:]
            layer.values = layer.values[index, :, trim:]
        self.pads = [p - trim for p in pads]
        return keep

    def clear(self) -> None:
        self.cache, self.pads = None, []

    def weights_updated(self) -> None:
        pass


__all__ = ["BatchRunner", "CompactRunner", "HFRunner", "SlotCache", "make_runner"]
