"""The three built-in compactors: the policy's own summary, older tool results dropped, the last N turns.

- ``summarize``: the policy is asked, in its current context, to summarise the history
  (``compaction_instruction``); the episode goes on from the prompt and that summary,
  given as a user message under :data:`SUMMARY_HEADER`. The summary's tokens are the
  policy's actions and are trained with the closed segment. An empty summary, or one
  cut off by the room left in the context, fails the compaction.
- ``drop_tool_outputs``: tool results (messages of role ``tool``) older than the last
  ``compaction_keep_turns`` turns are replaced by :data:`TOOL_OUTPUT_MARKER`; the rest
  of the conversation is kept. Nothing to replace fails the compaction (it would not
  shrink). Tool environments whose results use another role are not shortened.
- ``sliding``: the last ``compaction_keep_turns`` turns are kept after the prompt, the
  older ones are dropped; fewer turns than that fails the compaction.

A turn starts at an assistant message (:func:`telescope.api.compaction.turns_of`).
Whether the result fits under the threshold is checked by the orchestrator.
"""

from __future__ import annotations

from telescope.api.compaction import Compaction, CompactionFailed, Compactor, EpisodeHistory, PolicyHandle, turns_of
from telescope.api.records import Message

#: What a summary is introduced with in the new context.
SUMMARY_HEADER = "Summary of the conversation so far (written by you):\n\n"

#: What replaces an older tool result.
TOOL_OUTPUT_MARKER = "[tool output removed to save context]"


class Summarize(Compactor):
    """The policy writes a summary of its history; the episode continues from the prompt and the summary."""

    name = "summarize"

    async def compact(self, episode: EpisodeHistory, policy: PolicyHandle) -> Compaction:
        reply = await policy.reply([{"role": "user", "content": self.context.instruction}])
        if reply.truncated:
            raise CompactionFailed(
                "overflow",
                f"the summary did not fit: it was cut off after {len(reply.turn.output_token_ids)} tokens by "
                f"max_model_len ({self.context.max_model_len}) or max_tokens",
            )
        summary = reply.text.strip()
        if not summary:
            raise CompactionFailed("empty", "the policy's summary is empty")
        return Compaction(history=[{"role": "user", "content": SUMMARY_HEADER + summary}], replies=[reply])


class DropToolOutputs(Compactor):
    """Tool results older than the last ``keep_turns`` turns are replaced by a marker."""

    name = "drop_tool_outputs"

    async def compact(self, episode: EpisodeHistory, policy: PolicyHandle) -> Compaction:
        turns = turns_of(episode.history)
        older = len(turns) - self.context.keep_turns
        history: list[Message] = []
        replaced = 0
        for index, turn in enumerate(turns):
            for message in turn:
                if index < older and message.get("role") == "tool" and message.get("content") != TOOL_OUTPUT_MARKER:
                    message = {**message, "content": TOOL_OUTPUT_MARKER}
                    replaced += 1
                history.append(message)
        if not replaced:
            raise CompactionFailed(
                "overflow",
                f"no tool output older than the last {self.context.keep_turns} turns to drop: "
                "the context cannot shrink",
            )
        return Compaction(history=history)


class Sliding(Compactor):
    """Only the last ``keep_turns`` turns are kept after the prompt."""

    name = "sliding"

    async def compact(self, episode: EpisodeHistory, policy: PolicyHandle) -> Compaction:
        turns = turns_of(episode.history)
        keep = self.context.keep_turns
        if len(turns) <= keep:
            raise CompactionFailed(
                "overflow", f"the history has {len(turns)} turns, no more than the {keep} kept: it cannot shrink"
            )
        return Compaction(history=[message for turn in turns[-keep:] for message in turn])
