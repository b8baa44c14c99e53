"""The algorithm interface: advantages from rewards, per-token losses from log-probabilities.

An algorithm is pure math: it sees tensors and a small :class:`AlgorithmConfig`,
never the global run config, so it is tested on hand-computed tensors. The
trainer is algorithm-blind: it computes log-probabilities, asks the algorithm for
per-token losses, and normalises by an explicit global count of loss tokens.

:class:`AlgorithmCapabilities` is what the config validator needs to know without
importing torch (``group_based``, ``supports_ppo_clip``, ``ratio_based``, the
advantage normalisations the algorithm allows and its default). A class exposes it
as the class attribute ``capabilities``; a lazily registered algorithm passes it as
registration metadata (``register(name, "pkg.mod:Cls", **caps.as_metadata())``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    import torch

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
    """The slice of the run config that the math reads."""

    advantage_norm: AdvantageNorm = "group"
    use_ppo_clip: bool = False
    ppo_clip_ref_logprobs: Literal["rollout", "batch"] = "rollout"
    clip_low: float = 0.4
    clip_high: float = 0.5
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    dr_grpo_loss_agg_mode: Literal["token_mean", "token_sum_norm"] = "token_mean"
    use_tis: bool = False
    tis_cap: float = 2.0
    tis_logprob_clamp: float = 20.0
    max_tokens: int = 3700
    eps: float = 1e-6

    @classmethod
    def from_config(cls, config: TelescopeConfig) -> AlgorithmConfig:
        """Build from a validated run config (advantage_norm already resolved)."""
        values = {f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)}
        return cls(**values)


class Algorithm(ABC):
    """Base class of RL algorithms. One module per algorithm.

    Subclasses set ``name`` and ``capabilities`` and implement
    :meth:`group_advantages` and :meth:`token_loss`.
    """

    name: ClassVar[str] = ""
    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities()

    def __init__(self, config: AlgorithmConfig) -> None:
        self.config = config

    @abstractmethod
    def group_advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """Advantages of one group of rewards (shape [n]) before any batch normalisation."""

    @abstractmethod
    def token_loss(self, inputs: Any) -> Any:
        """Per-token policy loss for a micro-batch (see the trainer's loss inputs)."""
