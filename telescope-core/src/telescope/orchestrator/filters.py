"""Output checks on finished rollouts: overlong handling and the quality filters.

When a group of rollouts finishes, :class:`OutputChecks` looks at each scored rollout
and sets two fields of it (:class:`~telescope.api.records.Rollout`):

- ``filtered``: the filters that flag it. A flagged rollout stays in its group (its
  reward counts in the group's baseline, as the other rollouts' advantages are computed
  from all rewards) and in the training batch, but its loss mask is all false, so it
  adds no gradient and no loss tokens. Each reason is counted in the step's discard
  metrics (``discarded/<reason>/count``) and written to the rollout's record
  (``filtered``). The filters:

  - ``overlong`` (``filter_overlong``): the rollout was truncated, its finish reason is
    ``length`` (``max_tokens`` reached without EOS, or the trajectory filled
    ``max_model_len``);
  - ``gibberish`` (``filter_gibberish``): some generated token has an id above
    ``gibberish_token_threshold`` and was sampled with a log-probability below
    ``-log(vocab_size) - gibberish_logprob_offset``, i.e. markedly less likely than a
    uniform draw over the vocabulary: a rare sub-word sampled from a flat,
    high-entropy distribution, the way degenerate text starts;
  - ``repetition`` (``filter_repetition``): the completion text compresses too well,
    ``len(b) / len(zlib.compress(b, 1)) > repetition_compression_threshold`` where ``b``
    is the UTF-8 of its last 10000 characters (loops compress far better than prose;
    texts under 100 characters are never flagged).

- ``overlong_penalty``: DAPO's soft overlong punishment. With ``L`` the generated
  tokens (summed over turns), ``M = max_tokens`` and ``B = overlong_buffer_tokens``::

      penalty = 0                                 if L <= M - B
              = -factor * (L - (M - B)) / B       if M - B < L <= M
              = -factor                           if L > M  (multi-turn: the sum exceeds M)

  It is added to the reward the algorithm sees (after the environment's
  ``reward_min``/``reward_max`` scaling, see :func:`telescope.orchestrator.batching.training_rewards`),
  so it also decides whether a group's rewards are all equal (zero advantage).
  The reward records keep the environment's reward; the penalty is recorded beside it.

Evaluations apply none of this: they do not train.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from telescope.api.records import Rollout

if TYPE_CHECKING:
    from telescope.schema.config import TelescopeConfig

#: The filter names, in the order they are checked (and listed in ``Rollout.filtered``).
FILTER_REASONS = ("overlong", "gibberish", "repetition")

#: Characters at the end of a completion that the repetition check compresses.
REPETITION_WINDOW_CHARS = 10_000
#: Completions shorter than this are never called repetitive (too short to judge).
REPETITION_MIN_CHARS = 100


def overlong_penalty(length: int, max_tokens: int, buffer_tokens: int, factor: float) -> float:
    """DAPO's graduated length penalty (<= 0) for a completion of ``length`` tokens (see the module docstring)."""
    if factor <= 0:
        return 0.0
    start = max_tokens - buffer_tokens
    excess = length - start
    if excess <= 0:
        return 0.0
    return -factor * min(excess / buffer_tokens, 1.0)


def compression_ratio(text: str) -> float:
    """Bytes over zlib-compressed bytes (level 1) of the UTF-8 of the last 10000 characters of ``text``."""
    data = text[-REPETITION_WINDOW_CHARS:].encode("utf-8", errors="replace")
    if not data:
        return 1.0
    return len(data) / len(zlib.compress(data, 1))


def is_repetitive(text: str, threshold: float) -> bool:
    """Whether ``text`` (at least 100 characters) compresses better than ``threshold``."""
    return len(text) >= REPETITION_MIN_CHARS and compression_ratio(text) > threshold


def gibberish_logprob_floor(vocab_size: int, offset: float) -> float:
    """``-log(vocab_size) - offset``: below the uniform draw's log-probability by ``offset`` nats."""
    return -math.log(vocab_size) - offset


def is_gibberish(
    token_ids: Sequence[int], logprobs: Sequence[float], *, threshold: int, vocab_size: int, offset: float
) -> bool:
    """Whether some token has an id above ``threshold`` and a log-probability below the floor."""
    floor = gibberish_logprob_floor(vocab_size, offset)
    return any(tid > threshold and lp < floor for tid, lp in zip(token_ids, logprobs, strict=False))


@dataclass(frozen=True)
class OutputChecks:
    """The run's overlong and quality settings; :meth:`apply` sets a rollout's ``filtered`` and penalty."""

    vocab_size: int
    filter_overlong: bool = False
    overlong_penalty_factor: float = 0.0
    overlong_buffer_tokens: int = 256
    max_tokens: int = 3700
    filter_gibberish: bool = False
    gibberish_token_threshold: int = 100_000
    gibberish_logprob_offset: float = 2.0
    filter_repetition: bool = False
    repetition_compression_threshold: float = 10.0

    @classmethod
    def from_config(cls, config: TelescopeConfig, vocab_size: int) -> OutputChecks:
        c = config
        return cls(
            vocab_size=max(2, int(vocab_size)),
            filter_overlong=c.filter_overlong,
            overlong_penalty_factor=c.overlong_penalty_factor,
            overlong_buffer_tokens=c.overlong_buffer_tokens,
            max_tokens=c.max_tokens,
            filter_gibberish=c.filter_gibberish,
            gibberish_token_threshold=c.gibberish_token_threshold,
            gibberish_logprob_offset=c.gibberish_logprob_offset,
            filter_repetition=c.filter_repetition,
            repetition_compression_threshold=c.repetition_compression_threshold,
        )

    @property
    def active(self) -> bool:
        return (
            self.filter_overlong or self.filter_gibberish or self.filter_repetition or self.overlong_penalty_factor > 0
        )

    def reasons(self, rollout: Rollout) -> tuple[str, ...]:
        """The filters that flag ``rollout``, in :data:`FILTER_REASONS` order."""
        flagged: list[str] = []
        if self.filter_overlong and rollout.turns and rollout.finish_reason == "length":
            flagged.append("overlong")
        if self.filter_gibberish:
            ids = [t for turn in rollout.turns for t in turn.output_token_ids]
            logprobs = [lp for turn in rollout.turns for lp in turn.output_logprobs]
            if is_gibberish(
                ids,
                logprobs,
                threshold=self.gibberish_token_threshold,
                vocab_size=self.vocab_size,
                offset=self.gibberish_logprob_offset,
            ):
                flagged.append("gibberish")
        if self.filter_repetition and is_repetitive(rollout.completion_text, self.repetition_compression_threshold):
            flagged.append("repetition")
        return tuple(flagged)

    def penalty(self, rollout: Rollout) -> float:
        return overlong_penalty(
            rollout.completion_length, self.max_tokens, self.overlong_buffer_tokens, self.overlong_penalty_factor
        )

    def apply(self, rollout: Rollout) -> Rollout:
        """``rollout`` with ``filtered`` and ``overlong_penalty`` set (the same object when nothing applies)."""
        if not self.active:
            return rollout
        reasons, penalty = self.reasons(rollout), self.penalty(rollout)
        if not reasons and penalty == 0.0:
            return rollout
        return dataclasses.replace(rollout, filtered=reasons, overlong_penalty=penalty)
