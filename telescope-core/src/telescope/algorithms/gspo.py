"""GSPO (Qwen, "Group Sequence Policy Optimization"): a clipped *sequence* ratio.

``s_i = exp(mean_{t in i}(lp_t - lp_ref_t))`` over sample i's loss tokens, with the
token form ``s_i,t = sg(s_i) exp(lp_t - sg(lp_t))`` (same value, gradient through
every token). Each token carries ``max(-s_i,t A, -clip(s_i,t) A) / |y_i|``, so a
sample's tokens sum to its sequence loss.

Weighting: every *sequence* counts equally, as in the paper; the trainer divides
the summed terms by the global number of samples (``loss_denominator``), not by
the token count. The clip range is ``clip_low`` / ``clip_high`` (the paper uses
much tighter ranges than PPO, e.g. 3e-4 / 4e-4; set them accordingly).
"""

from __future__ import annotations

import torch

from telescope.algorithms import CAPABILITIES
from telescope.algorithms.common import group_normalised, log_ratio, masked
from telescope.api.algorithm import Algorithm, LossCounts, LossInputs


def sequence_mean(values: torch.Tensor, inputs: LossInputs) -> torch.Tensor:
    """Per-token broadcast of the mean of ``values`` over its sample's loss tokens."""
    seq = inputs.sequence_ids.clamp(min=0)
    num_sequences = int(inputs.sequence_lengths.numel())
    sums = torch.zeros(num_sequences, dtype=values.dtype, device=values.device)
    sums = sums.index_add(0, seq, masked(values, inputs.loss_mask))
    lengths = inputs.sequence_lengths.to(values.dtype).clamp(min=1)
    return (sums / lengths)[seq]


class GSPO(Algorithm):
    name = "gspo"
    capabilities = CAPABILITIES["gspo"]

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return group_normalised(rewards, self.config)

    def token_loss(self, inputs: LossInputs) -> torch.Tensor:
        log_seq_ratio = sequence_mean(log_ratio(inputs), inputs).detach()
        ratio = torch.exp(log_seq_ratio + inputs.logprobs - inputs.logprobs.detach())
        clipped = torch.clamp(ratio, 1.0 - self.config.clip_low, 1.0 + self.config.clip_high)
        per_sequence = torch.maximum(-ratio * inputs.advantages, -clipped * inputs.advantages)
        lengths = inputs.sequence_lengths.to(per_sequence.dtype).clamp(min=1)
        return per_sequence / lengths[inputs.sequence_ids.clamp(min=0)]

    def loss_denominator(self, counts: LossCounts) -> float:
        return float(max(counts.samples, 1))
