"""Load received named tensors into a running torch module, in place.

Names are Hugging Face state-dict names (``model.layers.0.self_attn.q_proj.weight``),
the naming every trainer backend sends. Tied weights (``lm_head.weight`` and
``model.embed_tokens.weight`` sharing one tensor) are found under either name. A
partial update (a subset of the names) is allowed; an unknown name or a shape
mismatch is an error that names the tensor, since loading half a model
silently would corrupt generation.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def load_named_tensors(module: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy each ``(name, tensor)`` into ``module``'s state (dtype and device converted); returns the count."""
    targets = module.state_dict(keep_vars=True)
    count = 0
    with torch.no_grad():
        for name, tensor in weights:
            target = targets.get(name)
            if target is None:
                known = ", ".join(list(targets)[:5])
                raise KeyError(
                    f"received weight {name!r} has no counterpart in the inference model "
                    f"(its names look like: {known}, ...); the trainer must send Hugging Face names"
                )
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"received weight {name!r} has shape {tuple(tensor.shape)}, the inference model "
                    f"expects {tuple(target.shape)}"
                )
            target.data.copy_(tensor, non_blocking=False)
            count += 1
    return count
