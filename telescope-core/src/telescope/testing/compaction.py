"""Conformance kit for compactors: inherit, give a factory, run pytest.

Usage, in a compaction package's tests::

    from telescope.testing.compaction import CompactorConformance

    class TestMyCompactor(CompactorConformance):
        factory = staticmethod(lambda context: MyCompactor(context))

Each inherited ``test_*`` checks one part of the contract of
:mod:`telescope.api.compaction` on a hand-made tool-using episode (:func:`long_episode`)
and a scripted policy (:class:`ScriptedPolicy`), the way the orchestrator calls it:

- it returns a :class:`~telescope.api.compaction.Compaction` whose history is a list of
  chat messages, shorter (in characters) than the episode's;
- it leaves the episode's messages as they were (they are the orchestrator's);
- it asks the policy at most once, and what it returns as replies are the policy's;
- given nothing it can shrink (an empty history, a policy that writes nothing) it returns
  a history or raises :class:`~telescope.api.compaction.CompactionFailed`, nothing else.

Override :attr:`CompactorConformance.context` for other lengths or instructions.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import ClassVar

from telescope.api.compaction import (
    Compaction,
    CompactionFailed,
    Compactor,
    EpisodeHistory,
    PolicyReply,
)
from telescope.api.context import CompactionContext
from telescope.api.records import Message, Turn


class ScriptedPolicy:
    """A :class:`~telescope.api.compaction.PolicyHandle` that answers ``text`` and records what it was asked."""

    def __init__(self, text: str = "The task is half done: the tools returned 3 and 7.") -> None:
        self.text = text
        self.asked: list[list[Message]] = []

    async def reply(self, messages: list[Message]) -> PolicyReply:
        self.asked.append(copy.deepcopy(messages))
        ids = list(range(3, 3 + len(self.text.split())))
        turn = Turn([1, 2], ids, [-0.5] * len(ids), policy_version=0, output_text=self.text)
        return PolicyReply(text=self.text, turn=turn)


def long_episode(turns: int = 6) -> EpisodeHistory:
    """A tool-using episode: a system prompt and a task, then ``turns`` calls with long tool results."""
    prompt: list[Message] = [
        {"role": "system", "content": "You add numbers with the add tool."},
        {"role": "user", "content": "Add every number from 1 to 12."},
    ]
    history: list[Message] = []
    for i in range(turns):
        call = f'<tool_call>{{"name": "add", "arguments": {{"a": {i}, "b": {i + 1}}}}}</tool_call>'
        history.append({"role": "assistant", "content": f"Adding {i} and {i + 1}. {call}"})
        history.append({"role": "tool", "content": f"result {2 * i + 1}; " + "details " * 40})
    return EpisodeHistory(prompt=prompt, history=history, context_tokens=2000)


def _characters(messages: list[Message]) -> int:
    return sum(len(str(m.get("content", ""))) for m in messages)


class CompactorConformance:
    """Inherit and set ``factory`` (a callable from a :class:`CompactionContext` to the compactor)."""

    #: Called with the kit's :attr:`context` (a staticmethod, or the class itself).
    factory: ClassVar[Callable[..., Compactor]]
    context: ClassVar[CompactionContext] = CompactionContext(
        max_model_len=4096, threshold=0.8, instruction="Summarize the conversation so far.", keep_turns=2
    )

    def compactor(self) -> Compactor:
        compactor = type(self).factory(self.context)
        assert isinstance(compactor, Compactor), f"the factory made {compactor!r}, not a Compactor"
        return compactor

    def run(self, episode: EpisodeHistory, policy: ScriptedPolicy) -> Compaction:
        return asyncio.run(self.compactor().compact(episode, policy))

    def test_returns_a_shorter_history_of_messages(self) -> None:
        episode = long_episode()
        result = self.run(episode, ScriptedPolicy())
        assert isinstance(result, Compaction)
        assert isinstance(result.history, list) and all(isinstance(m, dict) and "role" in m for m in result.history)
        assert _characters(result.history) < _characters(episode.history), "the compacted history is not shorter"

    def test_leaves_the_episode_as_it_was(self) -> None:
        episode = long_episode()
        before = copy.deepcopy((episode.prompt, episode.history))
        self.run(episode, ScriptedPolicy())
        assert (episode.prompt, episode.history) == before, "the compactor changed the episode's messages"

    def test_asks_the_policy_at_most_once_and_returns_only_its_replies(self) -> None:
        policy = ScriptedPolicy()
        result = self.run(long_episode(), policy)
        assert len(policy.asked) <= 1, f"the policy was asked {len(policy.asked)} times"
        assert len(result.replies) <= len(policy.asked)
        assert all(reply.text == policy.text for reply in result.replies)

    def test_nothing_to_shrink_is_a_compaction_failure_or_a_history(self) -> None:
        empty = EpisodeHistory(prompt=long_episode().prompt, history=[], context_tokens=30)
        try:
            result = self.run(empty, ScriptedPolicy(text=""))
        except CompactionFailed as exc:
            assert exc.reason in ("empty", "overflow")
        else:
            assert isinstance(result.history, list)
