"""Chat rendering: prompt token ids, and exact token continuation across turns.

The first turn's prompt is the chat template applied to the environment's
messages, with the generation prompt. For later turns, ``interleaved_rollouts``
keeps every token already in the trajectory as it is (the prompt, and the tokens
the model generated) and appends only the tokens of what is new: the closing
markup after the model's reply, the environment's messages and the next
generation prompt. Re-tokenizing the whole conversation instead can merge or split
tokens at the boundaries and make the trainer score tokens the model never
produced; with ``interleaved_rollouts: false`` that is what happens (the full
conversation is re-rendered and the earlier turns' token ids are replaced).

How the new tokens are found: render the conversation up to and including the
model's reply, and the conversation with the environment's messages and a
generation prompt; the difference of the two texts is the new text. What the
template adds after the reply's content (e.g. ``<|im_end|>\\n``) but the model did
not generate is prepended, so the token sequence is exactly the template's.
"""

from __future__ import annotations

from typing import Any

from telescope.api.records import Message


class ChatRenderer:
    """Wraps a Hugging Face tokenizer's chat template (or an override) for the orchestrator."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None, enable_thinking: bool = False) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.enable_thinking = enable_thinking
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the tokenizer has no chat template; set chat_template in the config "
                "(a Jinja2 template string) for base models without one"
            )

    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary (added tokens included), for the gibberish filter's uniform log-probability."""
        try:
            return len(self.tokenizer)
        except TypeError:
            return int(getattr(self.tokenizer, "vocab_size", 2) or 2)

    @property
    def eos_token(self) -> str:
        return str(self.tokenizer.eos_token or "")

    @property
    def eos_token_id(self) -> int | None:
        eos: int | None = self.tokenizer.eos_token_id
        return eos

    def render_text(
        self, messages: list[Message], *, add_generation_prompt: bool, continue_final_message: bool = False
    ) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if continue_final_message:
            kwargs["continue_final_message"] = True
        if self.chat_template is not None:
            kwargs["chat_template"] = self.chat_template
        if self.enable_thinking:
            kwargs["enable_thinking"] = True
        return str(self.tokenizer.apply_chat_template(messages, **kwargs))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens))

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """Token ids of the first turn's prompt, ending with the generation prompt.

        When the last message is the assistant's (a prefix the environment puts in the
        model's mouth, such as ``<think>``: ``add_thinking_prefix``), the prompt ends
        inside that message instead and the model continues it; the prefix is part of
        the prompt, not of the completion.
        """
        if messages and messages[-1].get("role") == "assistant":
            return self.encode(self.render_text(messages, add_generation_prompt=False, continue_final_message=True))
        return self.encode(self.render_text(messages, add_generation_prompt=True))

    def continuation_ids(
        self,
        history: list[Message],
        reply: Message,
        generated_ids: list[int],
        new_messages: list[Message],
    ) -> list[int]:
        """Tokens to append after the model's ``generated_ids`` for the next turn.

        ``history`` is the conversation before the model's reply, ``reply`` the
        assistant message (its content is the generated text without special
        tokens), ``new_messages`` the environment's messages.
        """
        before = self.render_text(history, add_generation_prompt=True)
        with_reply = self.render_text([*history, reply], add_generation_prompt=False)
        with_next = self.render_text([*history, reply, *new_messages], add_generation_prompt=True)
        if not with_reply.startswith(before) or not with_next.startswith(with_reply):
            raise ValueError(
                "the chat template does not render conversations as prefixes of each other, so tokens "
                "cannot be reused across turns; set interleaved_rollouts: false for this template"
            )
        reply_text = with_reply[len(before) :]
        generated_text = self.decode(generated_ids, skip_special_tokens=False)
        # What the template closes the reply with that the model did not generate.
        closing = reply_text[len(generated_text) :] if reply_text.startswith(generated_text) else ""
        if not reply_text.startswith(generated_text):
            content = str(reply.get("content", ""))
            tail_start = reply_text.find(content)
            closing = reply_text[tail_start + len(content) :] if tail_start >= 0 else ""
            eos = self.eos_token
            if eos and generated_text.endswith(eos) and closing.startswith(eos):
                closing = closing[len(eos) :]
        return self.encode(closing + with_next[len(with_reply) :])
