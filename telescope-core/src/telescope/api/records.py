"""Typed records that flow through the loop: samples, rollouts, groups, batches.

Design: plain dataclasses of Python values (no tensors), so that records cross
process boundaries (Ray) cheaply, are written to the run store as JSON, and are
built in tests without torch. The trainer turns a :class:`TrainingBatch` into
tensors itself.

A rollout is a list of :class:`Turn` records. Each turn holds the tokens the
environment or the prompt added (not trained on) and the tokens the model
generated (trained on), with the policy version of the weights that the turn was
*dispatched* with. The flat token view (``token_ids``, ``loss_mask``,
``inference_logprobs``, ``policy_versions``) is derived from the turns, so
multi-turn token ids are reused exactly across turns and never re-tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

#: A chat message in the OpenAI format: {"role": ..., "content": ...}.
Message = dict[str, Any]

FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass(frozen=True)
class Sample:
    """One dataset item: what to prompt with and what the reward function needs.

    ``prompt`` is either plain text or a list of chat messages. ``answer`` holds
    the reference (a number, a string, test cases, ...); ``metadata`` anything else
    the environment stored. ``sample_id`` is stable across runs (dataset index
    unless the environment sets one) and is the key for eval/train separation.
    """

    prompt: str | list[Message]
    answer: Any = None
    sample_id: str = ""
    environment: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class RewardResult:
    """What an environment's reward function returns.

    ``total_reward`` is the scalar the algorithm uses. ``sample_metrics`` holds any
    per-sample numbers worth charting (reward components, counts, timings); the
    run aggregates them per step (mean, std, min, max, Gini per group). ``error``
    is set when scoring failed; such a sample is counted and excluded from training.
    """

    total_reward: float
    sample_metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None


@dataclass
class Turn:
    """One exchange: tokens added before generation, then the tokens generated.

    ``input_token_ids``: the prompt (first turn) or the environment's reply
    (later turns), including chat-template tokens; never trained on.
    ``output_token_ids`` / ``output_logprobs``: what the inference engine sampled and
    the log-probabilities it reported (of the temperature-scaled distribution).
    ``policy_version``: the weights version when this turn was dispatched.
    """

    input_token_ids: list[int]
    output_token_ids: list[int]
    output_logprobs: list[float]
    policy_version: int
    finish_reason: FinishReason = "stop"
    output_text: str = ""

    def __post_init__(self) -> None:
        if len(self.output_token_ids) != len(self.output_logprobs):
            raise ValueError(
                f"a turn has {len(self.output_token_ids)} generated tokens but "
                f"{len(self.output_logprobs)} log-probabilities; they must match one to one"
            )


@dataclass
class Rollout:
    """One sampled trajectory for a sample: its turns, its reward, its messages."""

    sample: Sample
    turns: list[Turn]
    messages: list[Message] = field(default_factory=list)
    reward: RewardResult | None = None
    advantage: float | None = None
    error: str | None = None

    @property
    def token_ids(self) -> list[int]:
        ids: list[int] = []
        for turn in self.turns:
            ids.extend(turn.input_token_ids)
            ids.extend(turn.output_token_ids)
        return ids

    @property
    def loss_mask(self) -> list[bool]:
        mask: list[bool] = []
        for turn in self.turns:
            mask.extend([False] * len(turn.input_token_ids))
            mask.extend([True] * len(turn.output_token_ids))
        return mask

    @property
    def inference_logprobs(self) -> list[float]:
        """Per-token rollout log-probabilities; 0.0 where the mask is False."""
        out: list[float] = []
        for turn in self.turns:
            out.extend([0.0] * len(turn.input_token_ids))
            out.extend(turn.output_logprobs)
        return out

    @property
    def policy_versions(self) -> list[int]:
        """Per-token dispatch policy version (of the turn each token belongs to)."""
        out: list[int] = []
        for turn in self.turns:
            out.extend([turn.policy_version] * (len(turn.input_token_ids) + len(turn.output_token_ids)))
        return out

    @property
    def oldest_policy_version(self) -> int:
        return min(turn.policy_version for turn in self.turns)

    @property
    def prompt_length(self) -> int:
        return len(self.turns[0].input_token_ids) if self.turns else 0

    @property
    def completion_length(self) -> int:
        """Generated tokens, summed over turns."""
        return sum(len(t.output_token_ids) for t in self.turns)

    @property
    def finish_reason(self) -> FinishReason:
        return self.turns[-1].finish_reason if self.turns else "error"

    @property
    def completion_text(self) -> str:
        return "".join(t.output_text for t in self.turns)


@dataclass
class Group:
    """All rollouts sampled for one prompt (``group_size`` of them)."""

    sample: Sample
    rollouts: list[Rollout]

    @property
    def rewards(self) -> list[float]:
        return [r.reward.total_reward if r.reward else 0.0 for r in self.rollouts]

    @property
    def is_zero_advantage(self) -> bool:
        """All rewards equal: the group carries no learning signal."""
        rewards = self.rewards
        return len(set(rewards)) <= 1


@dataclass
class TrainingSample:
    """One rollout as the trainer sees it: flat tokens, mask, logprobs, advantage."""

    token_ids: list[int]
    loss_mask: list[bool]
    inference_logprobs: list[float]
    advantage: float
    policy_version: int = 0
    group_index: int = 0

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.inference_logprobs) != n:
            raise ValueError(
                f"a training sample has {n} tokens, {len(self.loss_mask)} mask entries and "
                f"{len(self.inference_logprobs)} log-probabilities; all three must be equal"
            )

    @classmethod
    def from_rollout(cls, rollout: Rollout, group_index: int = 0) -> TrainingSample:
        if rollout.advantage is None:
            raise ValueError("a rollout needs an advantage before it becomes a training sample")
        return cls(
            token_ids=rollout.token_ids,
            loss_mask=rollout.loss_mask,
            inference_logprobs=rollout.inference_logprobs,
            advantage=rollout.advantage,
            policy_version=rollout.oldest_policy_version,
            group_index=group_index,
        )

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class TrainingBatch:
    """What one trainer step consumes: the training samples of one rollout batch.

    ``step`` is the trainer step this batch is for; ``policy_version`` the version
    the trainer holds before the step.
    """

    samples: list[TrainingSample]
    step: int
    policy_version: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def num_loss_tokens(self) -> int:
        return sum(s.num_loss_tokens for s in self.samples)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.samples)
