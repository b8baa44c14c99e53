"""The algorithm interface: advantages from rewards, per-token losses from log-probabilities.

An algorithm is pure math: it sees tensors and a small :class:`AlgorithmConfig`,
never the global run config, so it is tested on hand-computed tensors. The
trainer is algorithm-blind: it computes log-probabilities, asks the algorithm for
per-token losses (:meth:`Algorithm.loss_terms`), and divides their sum by an
explicit global denominator (:meth:`Algorithm.loss_denominator`) computed over the
whole (mini)batch on every data-parallel rank before the backward pass.

:class:`AlgorithmCapabilities` is what the config validator needs to know without
importing torch (``group_based``, ``supports_ppo_clip``, ``ratio_based``, the
advantage normalisations the algorithm allows and its default). A class exposes it
as the class attribute ``capabilities``; a lazily registered algorithm passes it as
registration metadata (``register(name, "pkg.mod:Cls", **caps.as_metadata())``).

Conventions shared by every algorithm:

- ``logprobs`` (and ``ref_logprobs`` when it is the batch reference) are the
  trainer's, of the temperature-scaled distribution over the full vocabulary: ``log_softmax(logits / T)`` with ``T``
  from :func:`telescope.inference.embedded.sampling.logprob_temperature` (1 below
  the greedy threshold). ``inference_logprobs`` are what the engine reports: the
  distribution it sampled from, the same one when ``top_p`` is unset and the
  top-p truncated, renormalised one otherwise (see
  :mod:`telescope.inference.embedded.sampling` for what TIS can and cannot
  correct there).
- Tensors in :class:`LossInputs` are flat, one entry per *target* token of a
  micro-batch (padding included, masked out by ``loss_mask``).
- Advantages: :meth:`Algorithm.group_advantages` gives one group's advantages; with
  ``advantage_norm: batch`` it returns the group-*centred* values and
  :meth:`Algorithm.advantages` normalises them across the whole training batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    import torch

    from telescope.api.settings import PluginSettings
    from telescope.config.schema import TelescopeConfig

AdvantageNorm = Literal["group", "batch"]


@dataclass(frozen=True)
class AlgorithmCapabilities:
    """What an algorithm supports; read by the config validator at load time."""

    #: Advantages compare samples within a prompt group (needs group_size >= 2).
    group_based: bool = True
    #: PPO ratio clipping (use_ppo_clip) can be layered on the loss.
    supports_ppo_clip: bool = True
    #: The loss itself uses the ratio exp(lp - lp_ref) (cispo, gspo, sapo); TIS
    #: against the rollout reference would count the correction twice.
    ratio_based: bool = False
    #: The advantage normalisations allowed, and the one used when none is configured.
    advantage_norms: tuple[AdvantageNorm, ...] = ("group", "batch")
    default_advantage_norm: AdvantageNorm = "group"

    def as_metadata(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> AlgorithmCapabilities:
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in metadata.items() if k in names}
        if "advantage_norms" in values:
            values["advantage_norms"] = tuple(values["advantage_norms"])
        return cls(**values)


@dataclass(frozen=True)
class AlgorithmConfig:
    """The core's fields that every algorithm's math may read.

    A field that one algorithm alone reads is that algorithm's own setting
    (``sapo_tau_pos``, ``dr_grpo_loss_agg_mode``), declared at its registration and
    passed to the constructor as ``settings``.
    """

    advantage_norm: AdvantageNorm = "group"
    use_ppo_clip: bool = False
    ppo_clip_ref_logprobs: Literal["rollout", "batch"] = "rollout"
    clip_low: float = 0.4
    clip_high: float = 0.5
    use_tis: bool = False
    tis_cap: float = 2.0
    tis_logprob_clamp: float = 20.0
    max_tokens: int = 3700
    eps: float = 1e-6

    @classmethod
    def from_config(cls, config: TelescopeConfig, capabilities: AlgorithmCapabilities | None = None) -> AlgorithmConfig:
        """Build from a run config; an unset ``advantage_norm`` takes the algorithm's default."""
        values = {f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)}
        if values.get("advantage_norm") is None:
            values["advantage_norm"] = (capabilities or AlgorithmCapabilities()).default_advantage_norm
        return cls(**values)


@dataclass
class LossInputs:
    """Per-token tensors of one micro-batch, all of shape ``[T]`` (flat over the packed targets).

    ``logprobs`` carries the gradient; the others are constants. ``ref_logprobs`` is
    the ratio reference chosen by ``ppo_clip_ref_logprobs`` (rollout log-probabilities,
    or the trainer's own recomputed before the first optimizer step of the batch, the
    *batch reference* ``lp_old``, when :attr:`Algorithm.uses_batch_reference`).
    ``sequence_ids`` numbers the samples of the micro-batch (``-1`` on padding) and
    ``sequence_lengths[sequence_ids]`` is each sample's count of loss tokens.
    """

    logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    inference_logprobs: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    sequence_ids: torch.Tensor
    sequence_lengths: torch.Tensor


@dataclass(frozen=True)
class LossCounts:
    """Global counts over a (mini)batch on all data-parallel ranks, known before backward."""

    #: Tokens with ``loss_mask`` true.
    loss_tokens: int
    #: Samples with at least one loss token.
    samples: int


class Algorithm(ABC):
    """Base class of RL algorithms. One module per algorithm.

    Subclasses set ``name`` and ``capabilities`` and implement
    :meth:`group_advantages` and :meth:`token_loss`; they may override
    :meth:`loss_denominator` (dr_grpo, gspo do). The objective the trainer
    minimises for a (mini)batch is ``sum(loss_terms) / loss_denominator(counts)``.
    """

    name: ClassVar[str] = ""
    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities()

    def __init__(self, config: AlgorithmConfig, settings: PluginSettings | None = None) -> None:
        self.config = config
        self.settings = settings

    @abstractmethod
    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """Advantages of one group of rewards (shape [n]) before any batch normalisation."""

    @abstractmethod
    def token_loss(self, inputs: LossInputs) -> torch.Tensor:
        """Per-token policy loss ``[T]`` before masking and the TIS weight."""

    @property
    def uses_ratio(self) -> bool:
        """The loss reads ``ref_logprobs`` (a ratio-based loss, or PPO clipping on)."""
        return self.capabilities.ratio_based or self.config.use_ppo_clip

    @property
    def uses_batch_reference(self) -> bool:
        """``ref_logprobs`` is the batch reference ``lp_old`` (a ratio, and ``ppo_clip_ref_logprobs: batch``).

        The one rule the trainer reads to decide whether to recompute the
        log-probabilities before the first optimizer step of a batch.
        """
        return self.uses_ratio and self.config.ppo_clip_ref_logprobs == "batch"

    def loss_terms(self, inputs: LossInputs) -> torch.Tensor:
        """Masked per-token losses ``[T]``, times the truncated-IS weight when ``use_tis``.

        The TIS weight is ``sg(min(exp(clamp(lp_old - lp_inf, -c, c)), tis_cap))``:

        - with a batch reference (:attr:`uses_batch_reference`), ``lp_old`` is
          ``ref_logprobs``, the trainer's log-probabilities before the first
          optimizer step of the batch. The loss's ratio covers ``pi / pi_old`` and
          TIS only ``pi_old / pi_inf``, on every minibatch; weighting by the
          current ``pi / pi_inf`` would count ``pi / pi_old`` twice from the second
          minibatch on.
        - without one, ``lp_old`` is ``sg(logprobs)``, the current policy. The loss
          then has no ratio (TIS with a ratio against the rollout reference is
          rejected at load time), so nothing else covers ``pi / pi_old``: the
          weight ``pi / pi_inf`` is the whole correction from the sampler to the
          policy being differentiated, and equals ``pi_old / pi_inf`` on the first
          minibatch.
        """
        loss = self.token_loss(inputs)
        if self.config.use_tis:
            old = inputs.ref_logprobs if self.uses_batch_reference else inputs.logprobs
            loss = loss * tis_weight(old, inputs.inference_logprobs, self.config)
        return masked(loss, inputs.loss_mask)

    def loss_denominator(self, counts: LossCounts) -> float:
        """What the summed loss terms are divided by: the global loss-token count by default."""
        return float(max(counts.loss_tokens, 1))

    def advantages(self, groups_rewards: Sequence[Sequence[float]]) -> list[list[float]]:
        """Advantages for the groups of one training batch (what the orchestrator calls).

        Each group's rewards go through :meth:`group_advantages`; with
        ``advantage_norm: batch`` the result is then normalised across all the groups
        given (the whole training batch). A group of one sample (no baseline) or of
        equal rewards (no signal) gets exactly 0. Groups the orchestrator drops (zero
        advantage) are dropped *before* this call so that they do not dilute the
        batch statistics.
        """
        import torch

        per_group: list[torch.Tensor] = []
        for rewards in groups_rewards:
            tensor = torch.tensor(list(rewards), dtype=torch.float64)
            if tensor.numel() < 2 or bool((tensor == tensor[0]).all()):
                per_group.append(torch.zeros_like(tensor))  # no baseline / no signal: exactly 0
            else:
                per_group.append(self.group_advantages(tensor).to(torch.float64))
        if self.config.advantage_norm == "batch" and per_group:
            flat = torch.cat(per_group)
            if flat.numel():
                flat = (flat - flat.mean()) / (flat.std(unbiased=False) + self.config.eps)
            per_group = list(torch.split(flat, [t.numel() for t in per_group]))
        return [[float(x) for x in t] for t in per_group]


# ------------------------------------------------ the math loss_terms applies to every algorithm


def masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` where ``mask`` is true, 0 elsewhere (``where``, so padding never leaks NaN)."""
    import torch

    return torch.where(mask.bool(), values, torch.zeros_like(values))


def tis_weight(old_logprobs: torch.Tensor, inference_logprobs: torch.Tensor, config: AlgorithmConfig) -> torch.Tensor:
    """Truncated importance weight ``sg(min(exp(clamp(lp_old - lp_inf, -c, c)), tis_cap))``.

    ``old_logprobs`` is the trainer's policy the loss is taken relative to: the
    batch reference (log-probabilities before the first optimizer step of the
    batch) when the loss has a ratio against it, else the current log-probabilities
    (see :meth:`telescope.api.algorithm.Algorithm.loss_terms` for why). The weight
    corrects the mismatch between the sampler and the trainer on the tokens the
    sampler produced; it cannot restore tokens the sampler could not produce (top-p
    truncation, see :mod:`telescope.inference.embedded.sampling`).
    """
    import torch

    c = config.tis_logprob_clamp
    diff = torch.clamp(old_logprobs.detach() - inference_logprobs, -c, c)
    return torch.clamp(torch.exp(diff), max=config.tis_cap)
