"""GSPO (Qwen, "Group Sequence Policy Optimization"): a clipped *sequence* ratio.

``s_i = exp(mean_{t in i}(lp_t - lp_ref_t))`` over sample i's loss tokens, with the
token form ``s_i,t = sg(s_i) exp(lp_t - sg(lp_t))`` (same value, gradient through
every token). Each token carries ``max(-s_i,t A, -clip(s_i,t) A) / |y_i|``, so a
sample's tokens sum to its sequence loss.

Weighting: every *sequence* counts equally, as in the paper; the trainer divides
the summed terms by the global number of samples (``loss_denominator``), not by
the token count. The clip range is ``clip_low`` / ``clip_high`` (the paper uses
much tighter ranges than PPO, e.g. 3e-4 / 4e-4; set them accordingly).
``clip_ratio_c`` dual-clips the sequence loss (``min(., -c A)`` for ``A < 0``); the
KL penalty and entropy bonus are weighted ``1 / |y_i|`` per token, so they are
sequence means averaged over samples, like the loss.
"""

from __future__ import annotations

import torch

from telescope.algorithms import CAPABILITIES
from telescope.algorithms.common import group_normalised, log_ratio, per_sequence_sum, ppo_clip_loss
from telescope.api.algorithm import Algorithm, LossCounts, LossInputs


def sequence_mean(values: torch.Tensor, inputs: LossInputs) -> torch.Tensor:
    """Per-token broadcast of the mean of ``values`` over its sample's loss tokens."""
    lengths = inputs.sequence_lengths.to(values.dtype).clamp(min=1)
    return (per_sequence_sum(values, inputs) / lengths)[inputs.sequence_ids.clamp(min=0)]


class GSPO(Algorithm):
    name = "gspo"
    capabilities = CAPABILITIES["gspo"]

    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        return group_normalised(rewards, self.config)

    def token_loss(self, inputs: LossInputs) -> torch.Tensor:
        log_seq_ratio = sequence_mean(log_ratio(inputs), inputs).detach()
        ratio = torch.exp(log_seq_ratio + inputs.logprobs - inputs.logprobs.detach())
        per_sequence = ppo_clip_loss(ratio, inputs.advantages, self.config)
        return per_sequence * self.regulariser_weight(inputs)

    def regulariser_weight(self, inputs: LossInputs) -> torch.Tensor:
        """``1 / |y_i|`` per token: the KL penalty and entropy bonus are per-sequence means, like the loss."""
        lengths = inputs.sequence_lengths.to(inputs.logprobs.dtype).clamp(min=1)
        return 1.0 / lengths[inputs.sequence_ids.clamp(min=0)]

    def loss_denominator(self, counts: LossCounts) -> float:
        return float(max(counts.samples, 1))
