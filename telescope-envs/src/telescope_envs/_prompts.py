"""Prompt options shared by the single-turn environments: the thinking prefix.

``add_thinking_prefix`` (the upstream's environment option): the prompt ends with the
start of the model's answer, ``<think>``, as an assistant message that the chat
renderer leaves open (:meth:`telescope.orchestrator.chat.ChatRenderer.prompt_ids`), so
the model starts by reasoning. The prefix belongs to the prompt: the completion the
reward function sees starts after it.
"""

from __future__ import annotations

from telescope.api.records import Message, Sample

THINKING_PREFIX = "<think>"


class ThinkingPrefix:
    """Mixin for an environment class: ``format_prompt`` appends the open ``<think>`` assistant turn when asked."""

    add_thinking_prefix: bool = False

    def format_prompt(self, sample: Sample) -> list[Message]:
        messages: list[Message] = super().format_prompt(sample)  # type: ignore[misc]
        if self.add_thinking_prefix:
            messages.append({"role": "assistant", "content": THINKING_PREFIX})
        return messages
