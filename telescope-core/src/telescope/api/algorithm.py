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
  from :func:`telescope.api.temperature.logprob_temperature` (1 below
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
    from telescope.schema.config import TelescopeConfig

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
    #: The loss is itself a PPO-clipped ratio ``max(-s A, -clip(s) A)`` (gspo's sequence
    #: ratio), so dual clipping (``clip_ratio_c``) applies without ``use_ppo_clip``.
    clipped_ratio: bool = False
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
    passed to the constructor as ``settings``. The shared loss controls
    (``clip_ratio_c``, ``tis_mode``/``tis_floor``, ``kl_penalty_tau``/``kl_estimator``,
    ``entropy_coef``, ``seq_is_masking``/``seq_is_mask_*``) are applied by
    :meth:`Algorithm.loss_terms` and :func:`~telescope.algorithms.common.ppo_clip_loss`;
    their formulas are documented there.
    """

    advantage_norm: AdvantageNorm = "group"
    use_ppo_clip: bool = False
    ppo_clip_ref_logprobs: Literal["rollout", "batch"] = "rollout"
    clip_low: float = 0.4
    clip_high: float = 0.5
    use_tis: bool = False
    tis_cap: float = 2.0
    tis_logprob_clamp: float = 20.0
    #: Dual-clip PPO bound (> 1); None = off. See :func:`~telescope.algorithms.common.ppo_clip_loss`.
    clip_ratio_c: float | None = None
    #: ``truncate``: ``clamp(w, tis_floor, tis_cap)``; ``icepop``: ``w`` inside ``[tis_floor, tis_cap]``, else 0.
    tis_mode: Literal["truncate", "icepop"] = "truncate"
    tis_floor: float = 0.0
    #: Coefficient of the per-token KL penalty against the sampler; 0 = off.
    kl_penalty_tau: float = 0.0
    kl_estimator: Literal["k2", "k3"] = "k2"
    #: Coefficient of the entropy bonus (subtracted from the loss); 0 = off.
    entropy_coef: float = 0.0
    #: Drop whole sequences whose geometric-mean ratio ``pi_old / pi_inf`` leaves ``[low, high]``.
    seq_is_masking: bool = False
    seq_is_mask_low: float = 0.8
    seq_is_mask_high: float = 1.2
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
    ``entropy`` is the entropy of the trainer's (temperature-scaled) next-token
    distribution at each position, *with* gradient from the logits; the trainer
    computes it only when :attr:`Algorithm.needs_entropy` (``entropy_coef > 0``),
    else it is None.
    """

    logprobs: torch.Tensor
    ref_logprobs: torch.Tensor
    inference_logprobs: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    sequence_ids: torch.Tensor
    sequence_lengths: torch.Tensor
    entropy: torch.Tensor | None = None


@dataclass(frozen=True)
class LossMetrics:
    """What the shared loss controls contributed in one micro-batch (no gradient).

    ``kl_penalty`` and ``entropy_bonus`` are *sums* over the kept loss tokens of the
    terms :meth:`Algorithm.loss_terms` adds (``tau k_t g_t``) and subtracts (``coef H_t
    g_t``), ``g_t`` being :meth:`Algorithm.regulariser_weight`; divided by
    :meth:`Algorithm.loss_denominator` they are the parts of the objective, so
    ``loss = policy part + kl_penalty - entropy_bonus``. ``masked_sequences`` counts
    the samples ``seq_is_masking`` dropped. Each is None when its control is off.
    """

    kl_penalty: torch.Tensor | None = None
    entropy_bonus: torch.Tensor | None = None
    masked_sequences: torch.Tensor | None = None


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

    @property
    def needs_entropy(self) -> bool:
        """The loss reads ``LossInputs.entropy`` (``entropy_coef > 0``); the trainer then computes it."""
        return self.config.entropy_coef > 0

    def old_logprobs(self, inputs: LossInputs) -> torch.Tensor:
        """``lp_old`` of the corrections against the sampler (TIS weight, sequence IS masking), detached.

        The batch reference ``ref_logprobs`` when :attr:`uses_batch_reference`, else
        the current ``sg(logprobs)``; :meth:`loss_terms` says why.
        """
        return inputs.ref_logprobs.detach() if self.uses_batch_reference else inputs.logprobs.detach()

    def loss_terms(self, inputs: LossInputs) -> torch.Tensor:
        """Per-token losses ``[T]``: the policy loss with the shared corrections and regularisers.

        ``term_t = keep_t * (token_loss_t * w_t + tau * k_t * g_t - coef * H_t * g_t)``:

        - ``keep_t``: ``loss_mask`` minus the sequences ``seq_is_masking`` drops
          (:meth:`kept_tokens`).
        - ``w_t``: the importance weight, when ``use_tis`` (:func:`tis_weight`), of
          ``pi_old / pi_inf``. With a batch reference (:attr:`uses_batch_reference`),
          ``lp_old`` is ``ref_logprobs``, the trainer's log-probabilities before the
          first optimizer step of the batch: the loss's ratio covers ``pi / pi_old``
          and the weight only ``pi_old / pi_inf``, on every minibatch (weighting by
          the current ``pi / pi_inf`` would count ``pi / pi_old`` twice from the
          second minibatch on). Without one, ``lp_old`` is ``sg(logprobs)``: the loss
          then has no ratio (TIS with a ratio against the rollout reference is
          rejected at load time), so the weight ``pi / pi_inf`` is the whole
          correction from the sampler to the policy being differentiated.
        - ``tau * k_t``: the KL penalty against the sampler, when ``kl_penalty_tau >
          0`` (:func:`kl_penalty`); not importance-weighted.
        - ``coef * H_t``: the entropy bonus, when ``entropy_coef > 0``, with ``H_t``
          the entropy of the full next-token distribution (``inputs.entropy``, with
          gradient); not importance-weighted.
        - ``g_t``: :meth:`regulariser_weight`, so that the KL penalty and entropy
          bonus are aggregated like the policy loss (1 per token; ``1 / |y_i|`` for
          a sequence-level loss such as gspo's).

        Divided by :meth:`loss_denominator` the regularisers are the (token- or
        sequence-) mean KL penalty and entropy bonus. A sequence dropped by
        ``seq_is_masking`` still counts in that denominator (it is fixed before the
        backward pass, from the loss mask), as do tokens ``icepop`` weighs 0.
        """
        keep, _ = self.kept_tokens(inputs)
        loss = self.token_loss(inputs)
        if self.config.use_tis:
            loss = loss * tis_weight(self.old_logprobs(inputs), inputs.inference_logprobs, self.config)
        kl, bonus = self.regularisers(inputs)
        if kl is not None:
            loss = loss + kl
        if bonus is not None:
            loss = loss - bonus
        return masked(loss, keep)

    def kept_tokens(self, inputs: LossInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``loss_mask`` minus the sequences ``seq_is_masking`` drops, and how many it dropped.

        Off: ``(loss_mask, None)``. On: see :func:`sequence_is_mask`, with ``lp_old``
        from :meth:`old_logprobs`.
        """
        if not self.config.seq_is_masking:
            return inputs.loss_mask.bool(), None
        keep, dropped = sequence_is_mask(self.old_logprobs(inputs), inputs, self.config)
        return inputs.loss_mask.bool() & keep, dropped

    def regulariser_weight(self, inputs: LossInputs) -> torch.Tensor | float:
        """``g_t``: each token's weight in the KL penalty and entropy bonus; 1 (a token-level mean).

        A loss aggregated per sequence (gspo divides each token by ``|y_i|`` and the
        sum by the number of samples) overrides it to return ``1 / |y_i|``, so that
        its regularisers are sequence means too.
        """
        return 1.0

    def regularisers(self, inputs: LossInputs) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Per-token ``tau * k_t * g_t`` (KL penalty) and ``coef * H_t * g_t`` (entropy bonus), None when off.

        Not masked (:meth:`loss_terms` masks). Raises ``ValueError`` when
        ``entropy_coef > 0`` and ``inputs.entropy`` is None.
        """
        kl = bonus = None
        if not (self.config.kl_penalty_tau > 0 or self.needs_entropy):
            return kl, bonus
        weight = self.regulariser_weight(inputs)
        if self.config.kl_penalty_tau > 0:
            k = kl_penalty(inputs.logprobs, inputs.inference_logprobs, self.config.kl_estimator)
            kl = self.config.kl_penalty_tau * k * weight
        if self.needs_entropy:
            if inputs.entropy is None:
                raise ValueError("entropy_coef > 0 needs LossInputs.entropy (computed when needs_entropy)")
            bonus = self.config.entropy_coef * inputs.entropy * weight
        return kl, bonus

    def loss_metrics(self, inputs: LossInputs) -> LossMetrics:
        """The shared controls' contributions in this micro-batch (see :class:`LossMetrics`), without gradient.

        Recomputed from ``inputs`` (all per-token, cheap) by the base class's rules;
        an algorithm that overrides :meth:`loss_terms` should override this to match.
        """
        import torch

        with torch.no_grad():
            keep, dropped = self.kept_tokens(inputs)
            kl, bonus = self.regularisers(inputs)
            return LossMetrics(
                kl_penalty=masked(kl, keep).sum() if kl is not None else None,
                entropy_bonus=masked(bonus, keep).sum() if bonus is not None else None,
                masked_sequences=dropped,
            )

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
    """Importance weight of ``pi_old / pi_inf`` per token, detached; ``tis_mode`` chooses the bound.

    ``w = exp(clamp(lp_old - lp_inf, -c, c))`` with ``c = tis_logprob_clamp``, then

    - ``truncate``: ``clamp(w, tis_floor, tis_cap)`` (``tis_floor = 0``, the default,
      is no lower bound: the classic truncated IS ``min(w, tis_cap)``);
    - ``icepop``: ``w`` where ``tis_floor <= w <= tis_cap``, else 0 (the token is
      dropped from the policy loss rather than down-weighted; it still counts in
      the loss denominator).

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
    w = torch.exp(torch.clamp(old_logprobs.detach() - inference_logprobs, -c, c))
    if config.tis_mode == "icepop":
        inside = (w >= config.tis_floor) & (w <= config.tis_cap)
        return torch.where(inside, w, torch.zeros_like(w))
    return torch.clamp(w, min=config.tis_floor, max=config.tis_cap)


#: ``|lp - lp_inf|`` bound inside the KL penalty (keeps ``exp`` finite) and the cap of its k3 value.
KL_LOG_RATIO_CLAMP = 20.0
KL_K3_MAX = 10.0


def kl_penalty(logprobs: torch.Tensor, inference_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the sampler, with gradient through ``logprobs``.

    ``d = clamp(lp - lp_inf, -20, 20)``; the reference is the rollout (sampler)
    log-probability, as in the reference implementation, for every algorithm and
    minibatch (not the batch reference ``lp_old``):

    - ``k2``: ``d^2`` (the reference's scale, twice Schulman's ``k2 = d^2 / 2``):
      non-negative, symmetric in ``d``; for ``pi`` near ``pi_inf`` its mean is
      about ``2 KL``. Gradient ``2 d grad(lp)``.
    - ``k3``: ``min(exp(d) - 1 - d, 10)``. The tokens were drawn from the sampler
      ``q = pi_inf``, and with ``r = pi / q``, ``E_q[r - 1 - log r] = KL(q || pi)``:
      unbiased, non-negative per token, and its expected gradient
      ``E_q[(r - 1) grad(lp)]`` is exactly ``grad KL(pi_inf || pi)``. (The
      reference writes ``exp(-d) - 1 + d``, the on-policy form for ``KL(pi ||
      q)``; on sampler tokens its mean is ``chi2(q || pi) - KL(q || pi)``, the same
      sign slip as in the ``kl_divergence_inference`` note.) The cap at 10 bounds
      one token's penalty; tokens beyond it (``d`` above about 2.6 or below about
      -11) carry no KL gradient.
    """
    import torch

    d = torch.clamp(logprobs - inference_logprobs, -KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    if estimator == "k2":
        return d * d
    if estimator == "k3":
        return torch.clamp(torch.expm1(d) - d, max=KL_K3_MAX)
    raise ValueError(f"kl_estimator must be 'k2' or 'k3', got {estimator!r}")


def per_sequence_sum(values: torch.Tensor, inputs: LossInputs) -> torch.Tensor:
    """``[num_sequences]`` sums of ``values`` over each sample's loss tokens (padding excluded)."""
    import torch

    seq = inputs.sequence_ids.clamp(min=0)
    sums = torch.zeros(int(inputs.sequence_lengths.numel()), dtype=values.dtype, device=values.device)
    return sums.index_add(0, seq, masked(values, inputs.loss_mask))


def sequence_is_mask(
    old_logprobs: torch.Tensor, inputs: LossInputs, config: AlgorithmConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence-level importance masking: a per-token keep mask ``[T]`` and the count of dropped samples.

    A sample ``i`` with loss tokens is dropped when its geometric-mean ratio
    ``g_i = exp(mean_{t in i}(lp_old_t - lp_inf_t))`` leaves ``[seq_is_mask_low,
    seq_is_mask_high]`` (compared in log space, so no overflow); every token of it
    gets ``keep = False``. A sample without loss tokens is never counted. Samples
    are whole within a micro-batch (packing never splits one), so the counts of
    the micro-batches add up to the batch's.
    """
    import math

    log_ratio = old_logprobs.detach() - inputs.inference_logprobs
    lengths = inputs.sequence_lengths.to(log_ratio.device)
    mean = per_sequence_sum(log_ratio, inputs) / lengths.clamp(min=1).to(log_ratio.dtype)
    outside = (mean < math.log(config.seq_is_mask_low)) | (mean > math.log(config.seq_is_mask_high))
    dropped = outside & (lengths > 0)
    keep = ~dropped[inputs.sequence_ids.clamp(min=0)]
    return keep, dropped.sum()
