"""Training episodes behind the gateway: ``/episodes/{episode_id}/v1`` is one episode's API.

An agent program in a training run is given an OpenAI client whose base URL names its
episode. Calls under that URL are answered like any other gateway call (the same
rendering, parsing, errors and streams), with three differences, all made by the
episode's :class:`EpisodeBackend` (the orchestrator implements it):

- the prompt: :meth:`EpisodeBackend.chat_prompt_ids` may replace the rendered prompt by
  the episode's own recorded tokens (a conversation that goes on from an earlier call's
  reply reuses that call's prompt and completion tokens exactly);
- the generation: :meth:`EpisodeBackend.complete` sends the call to the episode's server
  with the run's sampling settings (the policy being trained samples as the trainer
  expects; ``temperature``, ``top_p``, ``seed`` and ``stop`` of the request are not
  used), so that it is recorded with its log-probabilities and policy versions;
- the record: :meth:`EpisodeBackend.record` receives the request and the parsed replies.

Any model name is accepted under an episode's URL: the episode serves the policy being
trained, whatever the agent program calls it. ``n`` must be 1 (one sequence per call is
what an episode trains on). An episode that has ended is a 404 naming it.
"""

from __future__ import annotations

from typing import Protocol

from telescope.inference.client import CompletionResult
from telescope.inference.gateway.schema import ChatCompletionRequest, TextCompletionRequest
from telescope.inference.gateway.service import SamplingOptions
from telescope.inference.gateway.tool_parsers import ParsedReply


class EpisodeBackend(Protocol):
    """What the gateway asks of one training episode (see the module docstring)."""

    def chat_prompt_ids(self, request: ChatCompletionRequest, rendered_ids: list[int], prefix: str) -> list[int]:
        """The prompt to generate from: ``rendered_ids`` (the template's, ending with the forced
        ``prefix``), or the recorded tokens it extends followed by its new part."""
        ...

    async def complete(self, prompt_ids: list[int], options: SamplingOptions) -> CompletionResult:
        """Generate on the episode's server; the tokens are recorded here."""
        ...

    def record(
        self,
        request: ChatCompletionRequest | TextCompletionRequest,
        prefix: str,
        result: CompletionResult,
        replies: list[ParsedReply],
    ) -> None:
        """The call's request and parsed replies (chat) once it is answered."""
        ...
