"""The environment interface: datasets, prompts and rewards, single- and multi-turn.

Three base classes, all sharing :class:`EnvironmentBase` (dataset and prompt side):

- :class:`BaseEnvironment`: single-turn. Implement ``load_dataset`` and
  ``compute_reward(completion, sample, eos_token) -> RewardResult``.
- :class:`MultiTurnEnvironment`: the model and the environment exchange messages.
  Implement ``env_response(messages, state)``, optionally ``is_done``, and
  ``compute_reward(messages, sample, state)`` over the whole interaction.
- :class:`telescope.api.tools.ToolEnvironment`: multi-turn with Python functions as
  tools.

Per-rollout state never lives on the environment object: one environment instance
serves many concurrent rollouts, and everything that belongs to one rollout is in
the :class:`RolloutState` the orchestrator creates and passes in.

Reward functions run in worker threads; an exception there marks that sample as
errored (counted in the metrics) and the run goes on. ``metrics_ranges`` declares
expected ranges of sample metrics for the dashboard; it does not affect training.

What an environment reads of the run is its :class:`~telescope.api.context.EnvironmentContext`
(``self.context``, set by the core with :func:`bind_context` after construction): the
run's ``sandbox_provider`` and ``browser_provider``. Three class attributes are checked
by ``telescope config validate`` before anything starts: ``requires`` (optional modules
the environment imports, with the command that installs each), ``uses_sandbox`` (it runs
model-written code: the provider it will use, the run's ``sandbox_provider`` or its own
``sandbox_provider`` keyword argument, must be registered and installed) and
``uses_browser`` (the same for ``browser_provider``). A fourth,
``data_files``, names the keyword arguments that may point at a local data file and
the fields each row needs: validation checks such a file exists, parses, and has them
(:mod:`telescope.config.data_files`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from telescope.api.context import EnvironmentContext
from telescope.api.records import Attachment, Message, RewardResult, Sample


class EnvironmentBase(ABC):
    """What every environment has: a name, a dataset and a way to render prompts.

    Constructor keyword arguments come from the config entry's ``kwargs``
    (for example ``dataset_name`` and ``dataset_split``); unknown ones should raise
    ``TypeError`` so that typos are caught.
    """

    #: The registered name (set by subclasses; used in messages and the run store).
    name: ClassVar[str] = ""
    #: Expected ranges of sample metrics, for charts only: {"metric": {"min": 0, "max": 1}}.
    metrics_ranges: ClassVar[dict[str, dict[str, float]]] = {}
    #: Optional system prompt prepended to every prompt.
    system_prompt: ClassVar[str | None] = None
    #: Optional modules the environment imports when used, {module: install command}; a
    #: missing one is a validate-time error naming the command.
    requires: ClassVar[dict[str, str]] = {}
    #: Whether it runs model-written code in sandboxes. The provider is the run's
    #: ``sandbox_provider`` (``self.context``) unless a ``sandbox_provider`` keyword argument
    #: overrides it; validation checks that the provider is registered and installed.
    uses_sandbox: ClassVar[bool] = False
    #: Whether it acts on web pages in browser sessions. The provider is the run's
    #: ``browser_provider`` unless a ``browser_provider`` keyword argument overrides it;
    #: validation checks that the provider is registered and installed.
    uses_browser: ClassVar[bool] = False
    #: Keyword arguments that may name a local data file (``.json``, ``.jsonl``, ``.csv``,
    #: ``.parquet``, or a path), each with the fields every row needs: {"dataset_name": ("question",
    #: "answer")}. Validation reports a missing file, a line that does not parse, or a row without
    #: a field, naming the file, the line and the field.
    data_files: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: The run context (the core sets it per instance; this default applies outside a run).
    context: EnvironmentContext = EnvironmentContext()

    @abstractmethod
    def load_dataset(self) -> Sequence[Sample]:
        """Return the samples of this environment, in a stable order.

        Load through ``datasets.load_dataset`` (a hub name or local files) so that
        the same code serves the hub and the small local files tests use.
        """

    def format_prompt(self, sample: Sample) -> list[Message]:
        """The chat messages sent to the model for a sample."""
        if isinstance(sample.prompt, str):
            messages: list[Message] = [{"role": "user", "content": sample.prompt}]
        else:
            messages = [dict(m) for m in sample.prompt]
        if self.system_prompt and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def prepare_resources(self) -> None:
        """Prepare expensive shared resources before the first rollout (e.g. warm a sandbox pool).

        Called once per run by the orchestrator, in a worker thread, after the
        evaluations before training and before the first rollout is dispatched, when
        ``eager_prepare_resources`` is true; otherwise never, and the environment
        creates what it needs on first use (so this must only move work earlier,
        never be required). An exception stops the run with the environment's name.
        Default: nothing.
        """

    def demonstration(self, sample: Sample) -> str | None:
        """A reference completion for ``sample``, for the optional supervised warm start.

        ``warm_start_steps`` fine-tunes the initial model on these before RL begins
        (a tiny model that never produces a well-formed answer gets no reward signal).
        Return None when the environment has none (the default).
        """
        return None

    @property
    def is_multi_turn(self) -> bool:
        return isinstance(self, MultiTurnEnvironment)


class BaseEnvironment(EnvironmentBase):
    """A single-turn environment: one prompt, one completion, one reward."""

    @abstractmethod
    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        """Score one completion.

        ``completion`` is the generated text (special tokens removed, except that
        ``eos_token`` is given so an environment can require a clean stop).
        Return the scalar reward and any per-sample metrics.
        """


def bind_context(environment: EnvironmentBase, context: EnvironmentContext | None) -> EnvironmentBase:
    """Give a built environment its run context (None keeps the default); returns it."""
    if context is not None:
        environment.context = context
    return environment


@dataclass
class RolloutState:
    """Everything that belongs to one multi-turn rollout (never kept on the environment).

    ``attachments``: files the environment keeps with the rollout (screenshots; see
    :class:`~telescope.api.records.Attachment`), recorded with it in the run store.
    """

    sample: Sample
    turn: int = 0
    data: dict[str, Any] = field(default_factory=dict)
    attachments: list[Attachment] = field(default_factory=list)


class MultiTurnEnvironment(EnvironmentBase):
    """A multi-turn environment: generate, respond, repeat until done, then score.

    The orchestrator loop, per rollout::

        state = env.initial_state(sample)
        messages = env.format_prompt(sample)
        while True:
            messages.append(<model reply>); state.turn += 1
            if env.is_done(messages, state): break
            messages.extend(env.env_response(messages, state))
        reward = env.compute_reward(messages, sample, state)

    With ``interleaved_rollouts`` the token ids of earlier turns are reused exactly
    and only the new messages are tokenized and appended.
    """

    #: Hard upper bound on model turns per rollout.
    max_turns: ClassVar[int] = 8

    def initial_state(self, sample: Sample) -> RolloutState:
        return RolloutState(sample=sample)

    def play_replies(self, sample: Sample, replies: Sequence[str]) -> tuple[list[Message], RolloutState, list[int]]:
        """Play scripted ``replies`` as the rollout loop plays a model's (the reply, ``is_done``, then
        ``env_response``) until done or the replies run out, without compaction.

        Returns the conversation, the state, and where each played reply stands in the
        conversation (the messages before it are its prompt). The warm start plays
        :meth:`demonstration_turns` with it; tests play scripted episodes.
        """
        messages = self.format_prompt(sample)
        state = self.initial_state(sample)
        positions: list[int] = []
        for reply in replies:
            positions.append(len(messages))
            messages.append({"role": "assistant", "content": reply})
            state.turn += 1
            if self.is_done(messages, state):
                break
            messages.extend(self.env_response(messages, state))
        return messages, state, positions

    def demonstration_turns(self, sample: Sample) -> list[str] | None:
        """Reference replies for the first turns of ``sample``, for the warm start (None: none, the default).

        The warm start plays them against this environment (``env_response`` after each,
        until ``is_done`` or the replies run out) and fine-tunes on every turn, each in
        the conversation the episode would have there. Without it, only
        :meth:`demonstration` (the first reply) is used.
        """
        return None

    @abstractmethod
    def env_response(self, messages: list[Message], state: RolloutState) -> list[Message]:
        """The environment's reply to the model's last message (usually one user message)."""

    def is_done(self, messages: list[Message], state: RolloutState) -> bool:
        """Whether the interaction is over; called after every model turn."""
        return state.turn >= self.max_turns

    @abstractmethod
    def compute_reward(self, messages: list[Message], sample: Sample, state: RolloutState) -> RewardResult:
        """Score the whole interaction."""
