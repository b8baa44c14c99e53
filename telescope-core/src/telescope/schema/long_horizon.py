"""Rules of long-horizon episodes: compaction lengths and staleness across weight updates.

Compaction (``compaction`` other than ``none``) runs an episode in a *working
context* of ``floor(compaction_threshold x max_model_len)`` tokens and compacts it
when that fills; what lies above it is the room for compacting (the summary
instruction and the summary). So the lengths must allow:

- a turn in the working context: ``max_tokens`` below the working context, else a
  single reply could fill it and every turn would compact;
- with ``summarize``, a summary in the room above it: at least
  :data:`MIN_SUMMARY_ROOM` tokens, else the summary is cut off at once.

``continue_requests_across_updates`` keeps requests generating across weight updates,
so an episode's early tokens grow stale while it runs: that only trains with
``stale_token_policy: mask`` (with ``drop_episode`` such episodes would be generated
and then thrown away).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from telescope.schema.fields import ConfigFields

#: Tokens the summarize compaction needs at least above the working context (its instruction and a summary).
MIN_SUMMARY_ROOM = 32


def long_horizon_problems(c: ConfigFields) -> list[str]:
    """One message per broken rule (see the module docstring)."""
    problems: list[str] = []
    if c.continue_requests_across_updates and c.stale_token_policy != "mask":
        problems.append(
            "continue_requests_across_updates: true needs stale_token_policy: mask: requests that keep generating "
            "across weight updates make episodes with stale tokens, which stale_token_policy: "
            f"{c.stale_token_policy} would discard; set stale_token_policy: mask or "
            "continue_requests_across_updates: false"
        )
    if c.compaction == "none":
        return problems
    working = int(c.compaction_threshold * c.max_model_len)
    if c.max_tokens >= working:
        problems.append(
            f"compaction_threshold ({c.compaction_threshold}) x max_model_len ({c.max_model_len}) = {working} tokens, "
            f"the context an episode runs in before it is compacted, must exceed max_tokens ({c.max_tokens}): one "
            "reply could fill it, and every turn would compact. Raise compaction_threshold or max_model_len, or "
            "lower max_tokens"
        )
    room = c.max_model_len - working
    if c.compaction == "summarize" and room < MIN_SUMMARY_ROOM:
        problems.append(
            f"compaction_threshold ({c.compaction_threshold}) leaves {room} tokens of max_model_len "
            f"({c.max_model_len}) above the working context for the summary instruction and the summary; "
            f"summarize needs at least {MIN_SUMMARY_ROOM}. Lower compaction_threshold or raise max_model_len"
        )
    return problems
