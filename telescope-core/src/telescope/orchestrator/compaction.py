"""The episode's side of compaction: when to compact, the tokens, the segments, and failures.

One :class:`EpisodeCompaction` per rollout (made by :func:`telescope.orchestrator.rollouts.run_rollout`
when the run has a compactor, for multi-turn environments). With it the episode runs in a
*working context* of ``floor(compaction_threshold x max_model_len)`` tokens: before a turn
whose reply (``max_tokens``) might not fit in what is left of it (the context counted with
the environment's pending reply), the run's :class:`~telescope.api.compaction.Compactor`
gives a shorter history, so a reply is never cut by the threshold. Then:

- the policy replies the compactor asked for (a summary) are generated in the current
  context, after the pending environment messages and the compactor's messages (an
  instruction), within what is left of ``max_model_len``; their turns close the segment, so
  they are trained as the policy's actions with the segment;
- the new context is the episode's prompt followed by the compactor's history, rendered
  anew (:meth:`ChatRenderer.prompt_ids`); the closed segment goes to ``Rollout.segments``
  and the episode goes on from the new context.

Failure (counted on the rollout, ``compaction/failed``, and an event): the compactor raised
:class:`~telescope.api.compaction.CompactionFailed` (an empty summary, one cut off), there was
nothing to compact (the prompt alone fills the working context), or the new context does not
leave room for a reply under the threshold. The failed attempt's replies are dropped (the trajectory is as it was),
compaction is off for the rest of the episode, and the episode goes on up to ``max_model_len``,
where it ends as it would without compaction. A compactor that raises anything else is a bug:
it errors the rollout like a failing environment.

Agent environments (programs behind the gateway) compact themselves: their harness rewrites
its own history, and the gateway's branching rule makes a request that does not extend the
previous one's tokens a new sequence of the episode.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from telescope.api import events
from telescope.api.compaction import (
    Compaction,
    CompactionFailed,
    Compactor,
    EpisodeHistory,
    FailureReason,
    PolicyReply,
)
from telescope.api.records import Message, Turn
from telescope.orchestrator.chat import ChatRenderer

#: generate_turn(context token ids of the segment, the turn's input ids, max_tokens) -> the generated turn
TurnGenerator = Callable[[list[int], list[int], int], Awaitable[Turn]]


@dataclass(frozen=True)
class Exchange:
    """The last model turn of a segment: the conversation before it, its reply, its generated ids."""

    history: list[Message]
    reply: Message
    generated_ids: list[int]


@dataclass(frozen=True)
class Compacted:
    """A successful compaction: the closed segment's turns and where the next segment starts."""

    closed: list[Turn]
    messages: list[Message]
    input_ids: list[int]


@dataclass
class Segment:
    """The current context segment as the rollout loop holds it."""

    turns: list[Turn]
    conversation: list[Message]
    pending_ids: list[int]
    last_exchange: Exchange | None

    @property
    def context_ids(self) -> list[int]:
        return [token for turn in self.turns for token in (*turn.input_token_ids, *turn.output_token_ids)]

    @property
    def used(self) -> int:
        """Tokens of the context with the pending input: what the next turn starts from."""
        return sum(len(t.input_token_ids) + len(t.output_token_ids) for t in self.turns) + len(self.pending_ids)


class _SegmentPolicy:
    """The :class:`PolicyHandle` a compactor is given: replies in the current segment's context."""

    def __init__(
        self,
        segment: Segment,
        renderer: ChatRenderer,
        generate_turn: TurnGenerator,
        max_model_len: int,
        max_tokens: int,
        interleaved: bool,
    ) -> None:
        self.segment = segment
        self.renderer = renderer
        self.generate_turn = generate_turn
        self.max_model_len = max_model_len
        self.max_tokens = max_tokens
        self.interleaved = interleaved
        self.replies: list[PolicyReply] = []

    def _input_ids(self, messages: list[Message]) -> list[int]:
        """Tokens after the segment's last generated ones: the pending messages, ``messages``, a generation prompt."""
        segment = self.segment
        last = segment.last_exchange
        if self.interleaved and last is not None:
            pending = segment.conversation[len(last.history) + 1 :]
            return self.renderer.continuation_ids(last.history, last.reply, last.generated_ids, pending + messages)
        full = self.renderer.prompt_ids([*segment.conversation, *messages])
        return full[len(segment.context_ids) :]

    async def reply(self, messages: list[Message]) -> PolicyReply:
        if self.replies:
            raise CompactionFailed("overflow", "a compactor may ask the policy once per compaction")
        input_ids = self._input_ids(messages)
        context = self.segment.context_ids
        budget = min(self.max_tokens, self.max_model_len - len(context) - len(input_ids))
        if budget <= 0:
            raise CompactionFailed(
                "overflow",
                f"no room for the policy's reply: the context ({len(context) + len(input_ids)} tokens with the "
                f"request) fills max_model_len ({self.max_model_len})",
            )
        turn = await self.generate_turn(context, input_ids, budget)
        reply = PolicyReply(text=turn.output_text, turn=turn)
        self.replies.append(reply)
        return reply


class EpisodeCompaction:
    """Compaction for one episode: see the module docstring."""

    def __init__(
        self,
        compactor: Compactor,
        prompt: list[Message],
        renderer: ChatRenderer,
        *,
        max_tokens: int,
        interleaved: bool = True,
    ) -> None:
        self.compactor = compactor
        self.prompt = [dict(m) for m in prompt]
        self.renderer = renderer
        self.max_tokens = max_tokens
        self.interleaved = interleaved
        self.max_model_len = compactor.context.max_model_len
        self.working_limit = compactor.context.working_limit
        self.count = 0
        self.failures: list[FailureReason] = []

    @property
    def active(self) -> bool:
        """Whether this episode still compacts (a failure turns it off)."""
        return not self.failures

    @property
    def limit(self) -> int:
        """Where the current segment's turns stop: the working context, or ``max_model_len`` after a failure."""
        return self.working_limit if self.active else self.max_model_len

    def due(self, used: int) -> bool:
        """Whether to compact before the next turn: a reply of ``max_tokens`` might not fit in the working context."""
        return self.active and used + self.max_tokens > self.working_limit

    async def compact(self, segment: Segment, generate_turn: TurnGenerator) -> Compacted | None:
        """Compact ``segment``; None when the compaction failed (counted; the episode goes on uncompacted)."""
        with events.timed(
            "rollout.compaction", component="orchestrator", compactor=self.compactor.name, context_tokens=segment.used
        ) as event:
            try:
                result = await self._compact(segment, generate_turn)
            except CompactionFailed as exc:
                self.failures.append(exc.reason)
                event.update(ok=False, reason=exc.reason, error=str(exc))
                return None
            self.count += 1
            event.update(ok=True, new_context_tokens=len(result.input_ids))
            return result

    async def _compact(self, segment: Segment, generate_turn: TurnGenerator) -> Compacted:
        if not segment.turns:
            raise CompactionFailed(
                "overflow",
                f"nothing to compact: the prompt alone ({segment.used} tokens) fills the working context "
                f"({self.working_limit} tokens)",
            )
        policy = _SegmentPolicy(
            segment, self.renderer, generate_turn, self.max_model_len, self.max_tokens, self.interleaved
        )
        history = EpisodeHistory(
            prompt=self.prompt, history=segment.conversation[len(self.prompt) :], context_tokens=segment.used
        )
        compaction: Compaction = await self.compactor.compact(history, policy)
        messages = [*self.prompt, *compaction.history]
        input_ids = self.renderer.prompt_ids(messages)
        if len(input_ids) + self.max_tokens > self.working_limit:
            raise CompactionFailed(
                "overflow",
                f"the compacted context ({len(input_ids)} tokens) leaves no room for a reply of max_tokens "
                f"({self.max_tokens}) under the working context ({self.working_limit} tokens)",
            )
        closed = [*segment.turns, *(reply.turn for reply in compaction.replies)]
        return Compacted(closed=closed, messages=messages, input_ids=input_ids)
