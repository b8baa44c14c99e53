"""The compaction interface: how a long episode continues once its context fills up.

A multi-turn episode (multi-turn, tool and agent environments) whose context reaches
``compaction_threshold x max_model_len`` tokens is *compacted*: the run's
:class:`Compactor` (chosen by the ``compaction`` setting, a plugin kind) is given the
conversation and returns a shorter history; the episode goes on in a new context
segment that starts with the episode's prompt (its system prompt and task) followed
by that history. The closed segment is kept and trained (see
:attr:`telescope.api.records.Rollout.segments`).

A compactor works on messages only. The orchestrator renders them to tokens, checks
the result and keeps the token bookkeeping; a compactor that needs the policy to write
something (a summary) asks through :class:`PolicyHandle`: the reply is generated in the
current context, after the messages given, and the orchestrator appends that reply's
tokens to the closed segment, so that they are trained like every action of the policy.

Failure: a compactor raises :class:`CompactionFailed` (an empty summary, a summary that
did not fit); the orchestrator also fails a compaction whose new context does not fit
under the threshold. A failed compaction is counted (``compaction/failed``), its policy
replies are dropped, and the episode goes on uncompacted up to ``max_model_len``, where it
ends as it would without compaction (no further attempt is made in that episode).

Built-ins (``telescope.compaction``): ``summarize``, ``drop_tool_outputs`` and ``sliding``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol

from telescope.api.context import CompactionContext
from telescope.api.records import Message, Turn

if TYPE_CHECKING:
    from telescope.api.settings import PluginSettings

#: Why a compaction failed: the policy's summary was empty, or it (or the new context) did not fit.
FailureReason = Literal["empty", "overflow"]


class CompactionFailed(Exception):
    """A compaction that cannot be used; ``reason`` is ``empty`` or ``overflow``."""

    def __init__(self, reason: FailureReason, message: str) -> None:
        super().__init__(message)
        self.reason: FailureReason = reason


@dataclass(frozen=True)
class EpisodeHistory:
    """The conversation a compactor sees: the episode's prompt, then what followed it in this segment.

    ``prompt`` is what the episode started with (system prompt and task), and is kept
    by every compaction; ``history`` is the rest of the current segment's conversation
    (assistant replies, environment and tool messages, an earlier summary).
    ``context_tokens`` is the length of the current context in tokens.
    """

    prompt: list[Message]
    history: list[Message]
    context_tokens: int

    @property
    def messages(self) -> list[Message]:
        return [*self.prompt, *self.history]


@dataclass(frozen=True)
class PolicyReply:
    """What the policy wrote when a compactor asked it: the text and the generated turn."""

    text: str
    turn: Turn

    @property
    def truncated(self) -> bool:
        """The reply was cut by the room left in the context (it did not fit)."""
        return self.turn.finish_reason == "length"


class PolicyHandle(Protocol):
    """Asks the policy for a reply in the current context, after ``messages`` (e.g. an instruction)."""

    async def reply(self, messages: list[Message]) -> PolicyReply: ...


@dataclass(frozen=True)
class Compaction:
    """A compactor's result: the new history (the prompt is prepended) and the policy replies to train."""

    history: list[Message]
    replies: list[PolicyReply] = field(default_factory=list)


class Compactor(ABC):
    """Base class of compaction strategies; one instance serves every episode of a run (no per-episode state)."""

    #: The registered name (set by subclasses; used in messages).
    name: ClassVar[str] = ""

    def __init__(self, context: CompactionContext, settings: PluginSettings | None = None) -> None:
        self.context = context
        self.settings = settings

    @abstractmethod
    async def compact(self, episode: EpisodeHistory, policy: PolicyHandle) -> Compaction:
        """The shorter history the episode continues from; raise :class:`CompactionFailed` when there is none."""


def turns_of(history: list[Message]) -> list[list[Message]]:
    """``history`` split into turns: each starts at an assistant message (leading non-assistant ones form the first)."""
    turns: list[list[Message]] = []
    for message in history:
        if message.get("role") == "assistant" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns
