"""Typed records that flow through the loop: samples, rollouts, groups, batches.

Design: plain frozen dataclasses of Python values (no tensors), so that records
cross process boundaries (Ray) cheaply, are written to the run store as JSON, and
are built in tests without torch. The trainer turns a :class:`TrainingBatch` into
tensors itself.

Records are immutable once made; each stage makes the next record: generation
makes :class:`Turn` and an unscored :class:`Rollout`, scoring makes the scored
rollout (``dataclasses.replace``), the orchestrator makes a :class:`Group`, and
batching makes a :class:`TrainingSample` per token sequence of a rollout, which is
where the advantage lives (a rollout has a reward, not an advantage).

An episode may train as several token sequences: ``Rollout.turns`` is its main
sequence and ``Rollout.segments`` holds the others (the earlier context segments of a
compacted episode, an agent's calls that do not extend the main chain). Each becomes
its own :class:`TrainingSample` with the episode's advantage; the group, and so the
advantage, is over episodes, not sequences.

A rollout is a list of :class:`Turn` records. Each turn holds the tokens the
environment or the prompt added (not trained on) and the tokens the model
generated (trained on). Policy versions: ``policy_version`` is the weights
version the turn was *dispatched* with; ``output_policy_versions`` has one entry
per generated token, the version the server reports produced it (the embedded
engine reports every token's; vLLM reports none, and the client fills in the
version it knew at dispatch). Staleness is measured on the output versions. The
flat token view (``token_ids``, ``loss_mask``, ``inference_logprobs``,
``policy_versions``) is derived from the turns, so multi-turn token ids are
reused exactly across turns and never re-tokenized.
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Attachment:
    """A file an environment keeps with a rollout (a screenshot of the page the model saw).

    ``turn``: how many model turns came before it (0: with the prompt; ``k``: what the
    environment showed after the model's ``k``-th reply). The run store writes ``data`` to
    a file in the run directory and records its path (``rollouts[].attachments``); the
    bytes never reach the trainer.
    """

    name: str
    media_type: str
    data: bytes
    turn: int = 0


@dataclass(frozen=True)
class Turn:
    """One exchange: tokens added before generation, then the tokens generated.

    ``input_token_ids``: the prompt (first turn) or the environment's reply
    (later turns), including chat-template tokens; never trained on.
    ``output_token_ids`` / ``output_logprobs``: what the inference engine sampled and
    the log-probabilities it reported.
    ``policy_version``: the weights version when this turn was dispatched.
    ``output_policy_versions``: per generated token, the version the server says
    produced it (empty means: all at ``policy_version``).
    """

    input_token_ids: list[int]
    output_token_ids: list[int]
    output_logprobs: list[float]
    policy_version: int
    finish_reason: FinishReason = "stop"
    output_text: str = ""
    output_policy_versions: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.output_token_ids) != len(self.output_logprobs):
            raise ValueError(
                f"a turn has {len(self.output_token_ids)} generated tokens but "
                f"{len(self.output_logprobs)} log-probabilities; they must match one to one"
            )
        if self.output_policy_versions and len(self.output_policy_versions) != len(self.output_token_ids):
            raise ValueError(
                f"a turn has {len(self.output_token_ids)} generated tokens but "
                f"{len(self.output_policy_versions)} policy versions; they must match one to one"
            )

    @property
    def token_versions(self) -> list[int]:
        """The version of each generated token (the dispatch version where the server reported none)."""
        return list(self.output_policy_versions) or [self.policy_version] * len(self.output_token_ids)

    @property
    def oldest_version(self) -> int:
        """The oldest weights that produced a token of this turn (the dispatch version if none)."""
        return min(self.output_policy_versions, default=self.policy_version)


@dataclass(frozen=True)
class Rollout:
    """One sampled trajectory for a sample: its turns, its messages and, once scored, its reward.

    The orchestrator's output checks (:mod:`telescope.orchestrator.filters`) set the last
    two fields when the rollout's group finishes: ``filtered`` names the filters that
    flagged it (``overlong``, ``gibberish``, ``repetition``; its loss is then masked,
    see :meth:`TrainingSample.from_rollout`) and ``overlong_penalty`` is the length
    penalty (<= 0) added to its reward for the advantages.

    A compacted episode (:mod:`telescope.api.compaction`) holds its closed context segments
    in ``segments``, counts its compactions in ``compactions`` and the reasons of the failed
    ones (``empty``, ``overflow``) in ``compaction_failures``; ``messages`` is then the
    conversation of its last segment.

    An agent episode (:mod:`telescope.api.agent`) keeps its model calls in order in
    ``agent_calls`` (per call: messages, reply, tokens, log-probabilities, latency, and
    ``sequence``, the index in :attr:`sequences` it trains in).

    ``attachments`` are the files its environment kept with it (:class:`Attachment`).
    """

    sample: Sample
    turns: list[Turn]
    messages: list[Message] = field(default_factory=list)
    reward: RewardResult | None = None
    error: str | None = None
    filtered: tuple[str, ...] = ()
    overlong_penalty: float = 0.0
    segments: list[list[Turn]] = field(default_factory=list)
    compactions: int = 0
    compaction_failures: tuple[str, ...] = ()
    agent_calls: list[dict[str, Any]] = field(default_factory=list)
    attachments: list[Attachment] = field(default_factory=list)

    @property
    def sequences(self) -> list[list[Turn]]:
        """Every token sequence the episode trains as: the other segments, then the main one (``turns``)."""
        return [*self.segments, self.turns]

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
        """Per-token policy version: the server-reported one for generated tokens, the dispatch one otherwise."""
        out: list[int] = []
        for turn in self.turns:
            out.extend([turn.policy_version] * len(turn.input_token_ids))
            out.extend(turn.token_versions)
        return out

    @property
    def oldest_policy_version(self) -> int:
        """The oldest weights that produced any generated token of any sequence (what staleness is measured on)."""
        return min(turn.oldest_version for sequence in self.sequences for turn in sequence)

    @property
    def prompt_length(self) -> int:
        return len(self.turns[0].input_token_ids) if self.turns else 0

    @property
    def completion_length(self) -> int:
        """Generated tokens of the main sequence, summed over its turns."""
        return sum(len(t.output_token_ids) for t in self.turns)

    @property
    def finish_reason(self) -> FinishReason:
        return self.turns[-1].finish_reason if self.turns else "error"

    @property
    def completion_text(self) -> str:
        return "".join(t.output_text for t in self.turns)


@dataclass(frozen=True)
class Group:
    """All rollouts sampled for one prompt (``group_size`` of them), and once scored their scaled rewards."""

    sample: Sample
    rollouts: list[Rollout]
    #: Each rollout's reward scaled to its environment's declared range, set once when the
    #: group is scored (:func:`telescope.orchestrator.batching.scored`); None before.
    scaled_rewards: list[float] | None = None

    @property
    def rewards(self) -> list[float]:
        return [r.reward.total_reward if r.reward else 0.0 for r in self.rollouts]

    @property
    def is_zero_advantage(self) -> bool:
        """All rewards equal: the group carries no learning signal."""
        rewards = self.rewards
        return len(set(rewards)) <= 1


@dataclass(frozen=True)
class TrainingSample:
    """One rollout as the trainer sees it: flat tokens, mask, logprobs, and its advantage."""

    token_ids: list[int]
    loss_mask: list[bool]
    inference_logprobs: list[float]
    advantage: float
    policy_version: int = 0
    group_index: int = 0
    rollout_index: int = 0
    segment_index: int = 0

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.inference_logprobs) != n:
            raise ValueError(
                f"a training sample has {n} tokens, {len(self.loss_mask)} mask entries and "
                f"{len(self.inference_logprobs)} log-probabilities; all three must be equal"
            )

    @classmethod
    def from_rollout(
        cls, rollout: Rollout, advantage: float, group_index: int = 0, rollout_index: int = 0
    ) -> TrainingSample:
        """The rollout's main sequence with its advantage; a filtered rollout's loss mask is all false."""
        return cls.from_turns(rollout.turns, rollout, advantage, group_index, rollout_index, len(rollout.segments))

    @classmethod
    def all_from_rollout(
        cls, rollout: Rollout, advantage: float, group_index: int = 0, rollout_index: int = 0
    ) -> list[TrainingSample]:
        """One sample per sequence of the rollout (``Rollout.sequences``), all with the episode's advantage."""
        return [
            cls.from_turns(turns, rollout, advantage, group_index, rollout_index, segment_index)
            for segment_index, turns in enumerate(rollout.sequences)
        ]

    @classmethod
    def from_turns(
        cls,
        turns: list[Turn],
        rollout: Rollout,
        advantage: float,
        group_index: int = 0,
        rollout_index: int = 0,
        segment_index: int = 0,
    ) -> TrainingSample:
        """One token sequence of ``rollout`` (its main one or a segment) as a sample.

        Its policy version is the oldest of that sequence's tokens; a filtered rollout's
        sequences all get an all-false loss mask.
        """
        sequence = Rollout(sample=rollout.sample, turns=turns)
        mask = sequence.loss_mask
        return cls(
            token_ids=sequence.token_ids,
            loss_mask=[False] * len(mask) if rollout.filtered else mask,
            inference_logprobs=sequence.inference_logprobs,
            advantage=float(advantage),
            policy_version=sequence.oldest_policy_version,
            group_index=group_index,
            rollout_index=rollout_index,
            segment_index=segment_index,
        )

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass(frozen=True)
class SupervisedExample:
    """A demonstration for supervised steps (the warm start): prompt tokens, then the target completion."""

    prompt_ids: list[int]
    completion_ids: list[int]

    def as_training_sample(self) -> TrainingSample:
        """Tokens with the loss on the completion only (advantage and log-probabilities unused)."""
        ids = [*self.prompt_ids, *self.completion_ids]
        mask = [False] * len(self.prompt_ids) + [True] * len(self.completion_ids)
        return TrainingSample(ids, mask, [0.0] * len(ids), advantage=0.0)


@dataclass(frozen=True)
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
