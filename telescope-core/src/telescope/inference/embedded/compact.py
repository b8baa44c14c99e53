"""A compact decoder forward for dense Llama-layout models, over a preallocated KV cache.

Why
---
On a small model the engine's time goes to per-call overhead, not FLOPs: a Hugging
Face forward walks dozens of ``nn.Module`` calls, builds masks and position tensors,
and its ``DynamicCache`` grows by ``torch.cat`` every step. This module runs the same
network with plain tensor ops:

- the weights are the Hugging Face model's own: the q/k/v projections are fused
  into one matrix and gate/up into another, and the model's parameters are then
  made *views* into those fused tensors, so an in-place weight update
  (:func:`telescope.inference.weight_updates.load_named_tensors` copies into
  ``param.data``) updates the fused weights too; :meth:`CompactDecoder.refresh`
  re-fuses if someone replaced a parameter's storage instead;
- a :class:`SlotCache` holds keys and values for ``rows`` sequences in tensors of
  shape ``[rows, kv_heads, capacity, head_dim]`` per layer, written in place at each
  row's own length (*right* padding: row ``r``'s tokens are columns ``0..len_r-1``),
  so a decode step appends with one ``index_put_`` per layer, never a ``cat``; the
  capacity grows geometrically (a copy, ``log`` times) up to the model length;
- attention is ``scaled_dot_product_attention`` with a boolean mask (column ``j``
  visible to a query at position ``p`` iff ``j <= p``), grouped-query heads passed
  as is (``enable_gqa``); RoPE reads cos/sin from a table the model's own rotary
  module computed once (so its scaling type is honoured);
- only the last valid position of each row goes through the final norm and the
  LM head.

A forward takes, per row, a start position and a run of new tokens (a decode step is
one token per row; a prefill several prompt chunks of different lengths, right-padded
together), so several prompts prefill in one call and a chunked prefill continues a
row's cache. Results equal the Hugging Face forward up to float rounding (the
engine's tests compare log-probabilities with the trainer's recomputation).

Limits
------
Supported: ``model_type`` in :data:`SUPPORTED_TYPES` with full attention in every
layer (no sliding window), SiLU MLP without bias, a static RoPE (``default``,
``linear``, ``llama3``, ``yarn``); :func:`unsupported_reason` says why another model
is not, and the engine then falls back to the Hugging Face forward. Padded batching:
attention reads the longest row's columns for every row (no paged, variable-length
kernel). On CUDA the decode step runs as a captured graph (:mod:`.cuda_graphs`); no
``torch.compile``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

#: Model families whose decoder layer this module reproduces.
SUPPORTED_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
_STATIC_ROPE = frozenset({"default", "linear", "llama3", "yarn"})


def unsupported_reason(model: Any) -> str | None:
    """Why the compact forward cannot run ``model`` (None: it can)."""
    config = model.config
    if config.model_type not in SUPPORTED_TYPES:
        return f"model_type {config.model_type!r} is not one of {sorted(SUPPORTED_TYPES)}"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        return "some layers use sliding-window attention"
    if getattr(config, "use_sliding_window", False) or (
        config.model_type == "mistral" and getattr(config, "sliding_window", None)
    ):
        return "sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "mlp_bias", False):
        return "the MLP is not a bias-free SiLU MLP"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in _STATIC_ROPE:
        return f"rope type {rope_type!r} depends on the sequence length"
    return None


class SlotCache:
    """Keys and values of ``rows`` sequences, written in place at each row's own length."""

    def __init__(self, decoder: CompactDecoder, rows: int, capacity: int) -> None:
        self.decoder = decoder
        shape = (max(rows, 1), decoder.kv_heads, max(capacity, 1), decoder.head_dim)
        self.keys = [torch.zeros(shape, dtype=decoder.dtype, device=decoder.device) for _ in decoder.layers]
        self.values = [torch.zeros(shape, dtype=decoder.dtype, device=decoder.device) for _ in decoder.layers]
        self.lengths: list[int] = [0] * rows
        self.rows = rows

    @property
    def capacity(self) -> tuple[int, int]:
        return self.keys[0].shape[0], self.keys[0].shape[2]

    def reserve(self, rows: int, columns: int) -> None:
        """Grow (geometrically) to hold ``rows`` rows of ``columns`` columns; keeps the contents."""
        have_rows, have_cols = self.capacity
        if rows <= have_rows and columns <= have_cols:
            return
        new_rows = have_rows if rows <= have_rows else max(rows, 2 * have_rows)
        new_cols = have_cols if columns <= have_cols else min(max(columns, 2 * have_cols), self.decoder.max_len)
        new_cols = max(new_cols, columns)
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                new = old.new_zeros((new_rows, old.shape[1], new_cols, old.shape[3]))
                new[: old.shape[0], :, : old.shape[2]] = old
                store[i] = new

    def append_rows(self, source: SlotCache, row: int, count: int) -> None:
        """Add ``count`` copies of ``source``'s row ``row`` after the current rows."""
        length = source.lengths[row]
        self.reserve(self.rows + count, length + 1)
        end = self.rows + count
        for dst, src in zip(self.keys + self.values, source.keys + source.values, strict=True):
            dst[self.rows : end, :, :length] = src[row : row + 1, :, :length]
        self.lengths.extend([length] * count)
        self.rows = end

    def keep(self, keep: list[int]) -> list[int]:
        """Keep the rows ``keep`` (increasing), compacted to the front; returns their new order.

        Each dropped row's place is taken by the last kept row (one copy per moved row),
        so the returned order is a permutation of ``keep``.
        """
        order = list(range(self.rows))
        kept = set(keep)
        holes = [i for i in range(len(keep)) if i not in kept]
        tail = [i for i in range(len(keep), self.rows) if i in kept]
        for hole, src in zip(holes, tail, strict=True):
            order[hole] = src
        if holes:
            dst_index = torch.tensor(holes, device=self.decoder.device)
            src_index = torch.tensor(tail, device=self.decoder.device)
            for store in (self.keys, self.values):
                for tensor in store:
                    tensor[dst_index] = tensor[src_index]
        new_lengths = [self.lengths[i] for i in order[: len(keep)]]
        self.lengths = new_lengths
        self.rows = len(keep)
        return order[: len(keep)]

    def tokens(self) -> int:
        return sum(self.lengths)


class CompactDecoder:
    """The decoder stack of a supported Hugging Face causal LM, as plain tensor ops (see the module doc)."""

    def __init__(self, model: Any, max_len: int) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the compact forward does not support this model: {reason}")
        config = model.config
        self.model = model
        self.max_len = max_len
        self.layers = list(model.model.layers)
        attn = self.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.scaling = float(attn.scaling)
        self.eps = float(config.rms_norm_eps)
        self.hidden = int(config.hidden_size)
        embed = model.model.embed_tokens.weight
        self.dtype, self.device = embed.dtype, embed.device
        rotary = model.model.rotary_emb
        positions = torch.arange(max_len + 1, device=self.device).unsqueeze(0)
        with torch.no_grad():
            cos, sin = rotary(torch.zeros(1, dtype=self.dtype, device=self.device), positions)
        self.cos, self.sin = cos[0], sin[0]  # [max_len + 1, head_dim]
        self.qkv: list[torch.Tensor] = []
        self.qkv_bias: list[torch.Tensor | None] = []
        self.gate_up: list[torch.Tensor] = []
        self._fuse()

    # ----------------------------------------------------------------- weights
    def _fused_parts(self) -> list[list[torch.nn.Parameter]]:
        out: list[list[torch.nn.Parameter]] = []
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            out.append([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
            if a.q_proj.bias is not None:
                out.append([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
            out.append([m.gate_proj.weight, m.up_proj.weight])
        return out

    def _fuse(self) -> None:
        """Concatenate q/k/v and gate/up, then point the model's parameters at slices of the result."""
        self.qkv, self.qkv_bias, self.gate_up = [], [], []
        with torch.no_grad():
            for layer in self.layers:
                a, m = layer.self_attn, layer.mlp
                self.qkv.append(_alias([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
                bias = a.q_proj.bias
                self.qkv_bias.append(None if bias is None else _alias([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
                self.gate_up.append(_alias([m.gate_proj.weight, m.up_proj.weight]))

    def refresh(self) -> None:
        """After a weight update: re-fuse if a parameter no longer aliases its fused tensor."""
        fused = [t for group in zip(self.qkv, self.qkv_bias, self.gate_up, strict=True) for t in group if t is not None]
        for parts, whole in zip(self._fused_parts(), fused, strict=True):
            base = whole.untyped_storage().data_ptr()
            if any(p.untyped_storage().data_ptr() != base for p in parts):
                self._fuse()
                return

    def weight_addresses(self) -> tuple[int, ...]:
        """Where every tensor the forward reads lives (a captured graph reads these addresses)."""
        tensors = [*self.qkv, *(b for b in self.qkv_bias if b is not None), *self.gate_up]
        tensors += [p for p in self.model.parameters()]
        return tuple(t.data_ptr() for t in tensors)

    def new_cache(self, rows: int, capacity: int) -> SlotCache:
        return SlotCache(self, rows, capacity)

    # ----------------------------------------------------------------- forward
    def forward(self, cache: SlotCache, tokens: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Feed ``tokens`` ``[R, C]`` (row ``r``'s first ``counts[r]`` valid) after each row's cache.

        Rows are the cache's first ``R``; their keys/values are written at columns
        ``lengths[r] ..`` and the lengths advance. Returns the logits of each row's
        last valid token, ``[R, vocab]``.
        """
        rows, width = tokens.shape
        starts = cache.lengths[:rows]
        end = max(s + c for s, c in zip(starts, counts, strict=True))
        cache.reserve(rows, end)
        start_t = torch.tensor(starts, device=self.device)
        if width == 1:
            logits = self.decode_step(cache, tokens[:, 0], start_t, end)
        else:
            logits = self._prefill(cache, tokens, counts, start_t, end)
        for r, c in enumerate(counts):
            cache.lengths[r] += c
        return logits

    def decode_step(self, cache: SlotCache, ids: torch.Tensor, positions: torch.Tensor, columns: int) -> torch.Tensor:
        """One token per row: ``ids[r]`` at column ``positions[r]`` of row ``r``; logits ``[R, vocab]``.

        Tensors in, tensors out, with shapes fixed by ``R = len(ids)`` and ``columns`` (the
        cache columns attended, at least every row's position + 1): no host
        synchronisation and no reallocation, so a CUDA graph can capture it
        (:mod:`.cuda_graphs`). ``cache.lengths`` is left to the caller. Rows past
        the cache's live rows (a graph's padding) write at their position and are
        otherwise ignored.
        """
        rows, device, d = ids.shape[0], self.device, self.head_dim
        positions = positions.clamp(max=self.max_len)
        hidden = torch.arange(columns, device=device).view(1, 1, 1, columns) > positions.view(rows, 1, 1, 1)
        bias = torch.zeros(hidden.shape, dtype=self.dtype, device=device).masked_fill_(hidden, float("-inf"))
        cos = self.cos[positions].view(rows, 1, 1, d)
        sin = self.sin[positions].view(rows, 1, 1, d)
        row_index = torch.arange(rows, device=device)
        group = self.heads // self.kv_heads

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            key_store, value_store = cache.keys[i], cache.values[i]
            key_store[row_index, :, positions] = k[:, :, 0]
            value_store[row_index, :, positions] = v[:, :, 0]
            keys, values = key_store[:rows, :, :columns], value_store[:rows, :, :columns]
            # one query per row: grouped heads as a batched matmul, no head repeat
            grouped = q.reshape(rows, self.kv_heads, group, d)
            scores = torch.matmul(grouped, keys.transpose(-1, -2)).mul_(self.scaling).add_(bias)
            return torch.matmul(torch.softmax(scores, dim=-1), values).reshape(rows, 1, self.heads * d)

        h = self._layers(F.embedding(ids.view(rows, 1), self.model.model.embed_tokens.weight), cos, sin, attend)
        return self._head(h[:, 0])

    def _prefill(
        self, cache: SlotCache, tokens: torch.Tensor, counts: list[int], start_t: torch.Tensor, end: int
    ) -> torch.Tensor:
        """Runs of several tokens per row (right-padded), attention by SDPA under a causal mask."""
        rows, width = tokens.shape
        device = self.device
        offsets = torch.arange(width, device=device)
        positions = (start_t.unsqueeze(1) + offsets).clamp_(max=self.max_len)  # [R, C]
        valid = offsets.unsqueeze(0) < torch.tensor(counts, device=device).unsqueeze(1)  # [R, C]
        write_rows = torch.arange(rows, device=device).unsqueeze(1).expand(rows, width)[valid]
        write_cols = positions[valid]
        columns = torch.arange(end, device=device)
        mask = columns.view(1, 1, 1, end) <= positions.view(rows, 1, width, 1)  # [R, 1, C, end]
        gqa = self.heads != self.kv_heads

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            key_store, value_store = cache.keys[i], cache.values[i]
            key_store[write_rows, :, write_cols] = k.transpose(1, 2)[valid]
            value_store[write_rows, :, write_cols] = v.transpose(1, 2)[valid]
            keys, values = key_store[:rows, :, :end], value_store[:rows, :, :end]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling, enable_gqa=gqa)
            return out.transpose(1, 2).reshape(rows, width, self.heads * self.head_dim)

        cos = self.cos[positions].unsqueeze(1)  # [R, 1, C, D]
        sin = self.sin[positions].unsqueeze(1)
        h = self._layers(F.embedding(tokens, self.model.model.embed_tokens.weight), cos, sin, attend)
        return self._head(h[torch.arange(rows, device=device), torch.tensor(counts, device=device) - 1])

    def _layers(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Any) -> torch.Tensor:
        """The decoder layers over ``h`` ``[R, C, H]``; ``attend(i, q, k, v)`` writes the cache and attends."""
        rows, width = h.shape[0], h.shape[1]
        nq, nkv, d = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.head_dim
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = self._norm(h, layer.input_layernorm.weight)
            qkv = F.linear(x, self.qkv[i], self.qkv_bias[i])
            v = qkv[..., nq + nkv :].view(rows, width, self.kv_heads, d).transpose(1, 2)
            if hasattr(attn, "q_norm"):
                q = self._norm(
                    qkv[..., :nq].view(rows, width, self.heads, d), attn.q_norm.weight, attn.q_norm.variance_epsilon
                )
                k = self._norm(
                    qkv[..., nq : nq + nkv].view(rows, width, self.kv_heads, d),
                    attn.k_norm.weight,
                    attn.k_norm.variance_epsilon,
                )
                qk = torch.cat([q, k], dim=2).transpose(1, 2)
            else:
                qk = qkv[..., : nq + nkv].view(rows, width, self.heads + self.kv_heads, d).transpose(1, 2)
            qk = qk * cos + _rotate_half(qk) * sin  # RoPE on q and k heads at once: [R, heads + kv, C, D]
            out = attend(i, qk[:, : self.heads], qk[:, self.heads :], v)
            h = h + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
            x = self._norm(h, layer.post_attention_layernorm.weight)
            gate, up = F.linear(x, self.gate_up[i]).chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate) * up, layer.mlp.down_proj.weight)
        return h

    def _head(self, last: torch.Tensor) -> torch.Tensor:
        """The final norm and the LM head over each row's last hidden state ``[R, H]``."""
        return F.linear(self._norm(last, self.model.model.norm.weight), self.model.lm_head.weight)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float | None = None) -> torch.Tensor:
        """RMSNorm as Hugging Face computes it (in float32, the weight applied in the input dtype)."""
        eps = self.eps if eps is None else eps
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _alias(parts: list[torch.nn.Parameter]) -> torch.Tensor:
    """One tensor holding ``parts`` stacked along dim 0; each part's ``.data`` becomes a view of it."""
    whole = torch.cat([p.data for p in parts], dim=0)
    at = 0
    for p in parts:
        size = p.shape[0]
        p.data = whole[at : at + size]
        at += size
    return whole
