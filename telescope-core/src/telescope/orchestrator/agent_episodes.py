"""One agent episode's calls: generated on its server, recorded, and assembled into training sequences.

:class:`AgentEpisode` is the :class:`~telescope.inference.gateway.episodes.EpisodeBackend`
of one episode of an :class:`~telescope.api.agent.AgentEnvironment`. The gateway hands it
each call the agent program makes under the episode's URL:

- **the prompt** (chat calls): when the request's messages go on from an earlier call of
  the episode (that call's messages, then its reply as the program sends it back, then
  new messages), the prompt is that call's recorded prompt and completion tokens followed
  by the tokens of what is new (:meth:`ChatFormat.continuation_ids
  <telescope.inference.gateway.chat.ChatFormat.continuation_ids>`), so the model reads its
  own tokens, not a re-tokenization of their text. Where the template's rendering of the
  whole conversation gives other tokens, the recorded ones win and the call counts in
  ``agent/retokenization_mismatches``; a template that does not render the conversation as
  an extension at all counts in ``agent/prefix_breaks`` and the call starts a new sequence
  from its rendered prompt. The earliest call with the longest matching history is the one
  continued, so concurrent calls that share a history each continue it.
- **the generation**: the rollout's ``generate`` (the group's server, the run's sampling,
  a per-call seed), so each token comes back with its log-probability and policy version.
  A server that cannot serve is remembered (:attr:`AgentEpisode.server_failure`) and the
  program gets a 503; the episode is then run again elsewhere, as any rollout is.
- **the record**: a :class:`RecordedCall` per call, in the order the calls were made.

:func:`assemble` turns the recorded calls into token sequences: a call whose prompt starts
with the whole token sequence of an earlier chain (its prompts and completions) extends it
as a new :class:`~telescope.api.records.Turn` (the prompt's new tokens not trained, the
completion trained); a call that extends none starts a chain of its own. The chain of the
episode's last call is the rollout's main sequence, the others its ``segments``: every
chain trains with the episode's advantage.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from telescope.api import events
from telescope.api.records import FinishReason, Turn
from telescope.inference.client import Completion, CompletionResult
from telescope.inference.gateway.chat import ChatFormat, template_message, template_tool_call
from telescope.inference.gateway.errors import GatewayError
from telescope.inference.gateway.schema import ChatCompletionRequest, TextCompletionRequest
from telescope.inference.gateway.service import SamplingOptions
from telescope.inference.gateway.tool_parsers import ParsedReply
from telescope.inference.generation import ServerUnavailable
from telescope.inference.protocol import new_request_id
from telescope.orchestrator.rollouts import GenerateFn, token_versions


@dataclass
class RecordedCall:
    """One model call of an episode, as generated (tokens) and as asked (messages, for chat calls)."""

    index: int
    route: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    token_versions: list[int]
    policy_version: int
    finish_reason: FinishReason
    start: float
    latency_s: float
    request_id: str
    text: str = ""
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    reply: dict[str, Any] | None = None
    #: the index of the call whose tokens this call's prompt reuses (None: rendered afresh)
    continues: int | None = None
    #: the template's own rendering of the prompt differed from the recorded tokens
    mismatch: bool = False
    sequence: int = -1

    def turn(self, input_ids: list[int]) -> Turn:
        return Turn(
            input_token_ids=input_ids,
            output_token_ids=list(self.completion_ids),
            output_logprobs=list(self.logprobs),
            policy_version=self.policy_version,
            finish_reason=self.finish_reason,
            output_text=self.text,
            output_policy_versions=list(self.token_versions),
        )

    def summary(self, previous: RecordedCall | None = None) -> dict[str, Any]:
        """What the run store keeps of the call (the dashboard's view of an episode).

        ``messages`` are the request's messages from ``first_message`` on: after the messages
        and the reply of ``previous`` (the call it continues), so that an episode's history
        is stored once, not once per call.
        """
        known = len(previous.messages) + 1 if previous is not None and previous.messages is not None else 0
        return {
            "index": self.index,
            "route": self.route,
            "sequence": self.sequence,
            "continues": self.continues,
            "mismatch": self.mismatch,
            "start": self.start,
            "latency_s": self.latency_s,
            "prompt_tokens": len(self.prompt_ids),
            "completion_tokens": len(self.completion_ids),
            "finish_reason": self.finish_reason,
            "first_message": known,
            "messages": None if self.messages is None else self.messages[known:],
            "reply": self.reply,
            "logprobs": self.logprobs,
        }


def _message_key(message: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two template messages the same turn (ids and JSON spacing aside)."""
    calls = tuple(
        (call["function"]["name"], json.dumps(call["function"]["arguments"], sort_keys=True))
        for call in message.get("tool_calls") or ()
    )
    content = message.get("content") or ""
    return (message["role"], content.strip() if calls else content, calls, message.get("tool_call_id"))


def reply_message(reply: ParsedReply) -> dict[str, Any]:
    """A parsed reply as the template message the program will send back."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [template_tool_call(call.id, call.name, call.arguments) for call in reply.tool_calls]
    return message


@dataclass
class EpisodeCounters:
    calls_refused: int = 0
    prefix_breaks: int = 0


class AgentEpisode:
    """The episode's side of the gateway (see the module docstring)."""

    def __init__(
        self,
        chat: ChatFormat,
        generate: GenerateFn,
        policy_version: Callable[[], int],
        *,
        max_tokens: int,
        max_calls: int,
    ) -> None:
        self.chat = chat
        self.generate = generate
        self.policy_version = policy_version
        self.max_tokens = max_tokens
        self.max_calls = max_calls
        self.calls: list[RecordedCall] = []
        self.counters = EpisodeCounters()
        self.server_failure: ServerUnavailable | None = None
        self._started = 0
        self._pending_continues: dict[int, tuple[int, bool]] = {}
        # the gateway answers in its own tasks: events carry the rollout's ids explicitly
        self._event_context = events.current_context()

    # ------------------------------------------------------------ the prompt
    def chat_prompt_ids(self, request: ChatCompletionRequest, rendered_ids: list[int], prefix: str) -> list[int]:
        messages = [template_message(m) for m in request.messages]
        tools = self.chat.rendered_tools(request)
        keys = [_message_key(m) for m in messages]
        for call in sorted(self.calls, key=lambda c: (-len(c.messages or ()), c.index)):
            if call.messages is None or call.reply is None or call.tools != tools:
                continue
            n = len(call.messages)
            if len(messages) <= n + 1 or keys[:n] != [_message_key(m) for m in call.messages]:
                continue
            if keys[n] != _message_key(call.reply):
                continue
            new = self.chat.continuation_ids(call.messages, tools, messages[n], call.completion_ids, messages[n + 1 :])
            if new is None:
                self.counters.prefix_breaks += 1
                return rendered_ids
            prompt = [*call.prompt_ids, *call.completion_ids, *new, *(self.chat.encode(prefix) if prefix else [])]
            self._pending_continues[id(request)] = (call.index, prompt != rendered_ids)
            return prompt
        return rendered_ids

    # -------------------------------------------------------- the generation
    async def complete(self, prompt_ids: list[int], options: SamplingOptions) -> CompletionResult:
        if self._started >= self.max_calls:
            self.counters.calls_refused += 1
            raise GatewayError(
                400,
                f"this episode has made its {self.max_calls} model calls (the environment's max_calls); "
                "no more are served",
                code="episode_call_limit",
            )
        index = self._started
        self._started += 1
        budget = min(options.max_tokens or self.max_tokens, self.max_tokens)
        version = self.policy_version()
        start, t0 = time.time(), time.perf_counter()
        try:
            with events.context(**self._event_context, call=index):
                generation = await self.generate(list(prompt_ids), budget, index)
        except ServerUnavailable as exc:
            self.server_failure = exc
            raise GatewayError(503, f"the episode's inference server is unavailable: {exc}") from None
        text = self.chat.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        versions = token_versions(generation) or [version] * len(generation.token_ids)
        request_id = new_request_id()
        self.calls.append(
            RecordedCall(
                index=index,
                route="completions",
                prompt_ids=list(prompt_ids),
                completion_ids=list(generation.token_ids),
                logprobs=list(generation.logprobs),
                token_versions=versions,
                policy_version=version,
                finish_reason=generation.finish_reason,
                start=start,
                latency_s=time.perf_counter() - t0,
                request_id=request_id,
                text=str(text),
            )
        )
        completion = Completion(
            index=0,
            text=str(text),
            token_ids=list(generation.token_ids),
            logprobs=list(generation.logprobs),
            finish_reason="length" if generation.finish_reason == "length" else "stop",
            stop_reason=None,
            prompt_token_ids=list(prompt_ids),
            policy_version_start=min(versions, default=version),
            policy_version_end=max(versions, default=version),
            token_policy_versions=versions,
        )
        return CompletionResult(request_id, list(prompt_ids), [completion], len(prompt_ids), len(completion.token_ids))

    # ------------------------------------------------------------ the record
    def record(
        self,
        request: ChatCompletionRequest | TextCompletionRequest,
        prefix: str,
        result: CompletionResult,
        replies: list[ParsedReply],
    ) -> None:
        call = next((c for c in self.calls if c.request_id == result.request_id), None)
        if call is None:
            return
        continued = self._pending_continues.pop(id(request), None)
        if continued is not None:
            call.continues, call.mismatch = continued
        if isinstance(request, ChatCompletionRequest) and replies:
            call.route = "chat"
            call.messages = [template_message(m) for m in request.messages]
            call.tools = self.chat.rendered_tools(request)
            call.reply = reply_message(replies[0])  # parsed with a forced call's prefix put back
        with events.context(**self._event_context):
            self._emit(call)

    @staticmethod
    def _emit(call: RecordedCall) -> None:
        events.emit(
            "agent.call",
            start=call.start,
            duration_s=call.latency_s,
            component="orchestrator",
            call=call.index,
            route=call.route,
            prompt_tokens=len(call.prompt_ids),
            completion_tokens=len(call.completion_ids),
            continues=call.continues,
            tool_calls=[c["function"]["name"] for c in (call.reply or {}).get("tool_calls") or ()],
        )

    # ------------------------------------------------------------- metrics
    def metrics(self) -> dict[str, float]:
        """Per-episode numbers (the step averages them): calls, reuse, mismatches, refusals."""
        calls = len(self.calls)
        return {
            "agent/calls": float(calls),
            "agent/calls_continued": float(sum(c.continues is not None for c in self.calls)),
            "agent/retokenization_mismatches": float(sum(c.mismatch for c in self.calls)),
            "agent/prefix_breaks": float(self.counters.prefix_breaks),
            "agent/calls_refused": float(self.counters.calls_refused),
        }


@dataclass
class _Chain:
    tokens: list[int]
    turns: list[Turn] = field(default_factory=list)
    last_call: int = -1


def assemble(calls: list[RecordedCall]) -> tuple[list[Turn], list[list[Turn]]]:
    """The episode's training sequences from its calls: (main sequence, the others); sets each call's ``sequence``."""
    chains: list[_Chain] = []
    for call in sorted(calls, key=lambda c: c.index):
        prompt = call.prompt_ids
        extended = [c for c in chains if len(c.tokens) <= len(prompt) and prompt[: len(c.tokens)] == c.tokens]
        chain = max(extended, key=lambda c: len(c.tokens), default=None)
        if chain is None:
            chain = _Chain(tokens=[])
            chains.append(chain)
        chain.turns.append(call.turn(list(prompt[len(chain.tokens) :])))
        chain.tokens = [*prompt, *call.completion_ids]
        chain.last_call = call.index
        call.sequence = chains.index(chain)
    if not chains:
        return [], []
    main = max(range(len(chains)), key=lambda i: chains[i].last_call)
    others = [chain.turns for i, chain in enumerate(chains) if i != main]
    for call in calls:  # sequence numbers as the rollout holds them: segments first, the main one last
        call.sequence = len(others) if call.sequence == main else call.sequence - (call.sequence > main)
    return chains[main].turns, others
