"""One rollout: generate (turn by turn for multi-turn environments), then score.

- Every turn records the policy version of the weights when it was *dispatched*
  (the upstream stamped it at completion, and only for the first turn) and, per
  generated token, the version the server reports produced it; staleness is
  measured on the latter.
- Records are made once: the turns as generation ends, the rollout after
  scoring (an unscored rollout is scored, then replaced by the scored one).
- Environment code (rewards, environment replies, tools) runs in worker threads:
  a slow reward never blocks generation, and an exception marks this rollout as
  errored (``rollout.error``, a zero reward, counted in the metrics) instead of
  stopping the run. The error names the exception, the call, the sample and where
  the exception was raised (:func:`raised_at`), so a run that stops because every
  rollout errors (:mod:`telescope.orchestrator.group_streaks`) can say why. A
  reward or an environment step that runs past its limit
  (``RolloutLimits.reward_timeout_s`` / ``environment_step_timeout_s``) is abandoned
  the same way, its error starting with ``timeout/<kind>:``
  (:mod:`telescope.orchestrator.deadlines`).
- A server that cannot serve (:class:`ServerUnavailable`: it died, or is being
  restarted) is not the rollout's fault: the exception propagates, and the
  scheduler re-dispatches the whole group.
- The generation lane (``lane``) can be released as soon as generation ends,
  before the reward is computed (``free_lane_after_generation``).
- Each turn's ``max_tokens`` is capped so that the trajectory stays within
  ``max_model_len``; a trajectory that reaches it ends with finish reason ``length``,
  unless the run compacts (``compaction``): then a multi-turn episode whose context
  reaches ``compaction_threshold x max_model_len`` goes on in a new context segment
  (:mod:`telescope.orchestrator.compaction`, the hook point is the top of the turn loop).
- Timeline: events emitted during a turn's generation and environment reply carry
  ``turn`` (an event context); scoring is one ``reward.compute`` event (``sample_id``,
  ``environment``, ``reward``, ``error``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from telescope.api import events
from telescope.api.compaction import Compactor
from telescope.api.environment import BaseEnvironment, EnvironmentBase, MultiTurnEnvironment, RolloutState
from telescope.api.records import Message, RewardResult, Rollout, Sample, Turn
from telescope.inference.generation import Generation, ServerUnavailable
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.compaction import EpisodeCompaction, Exchange, Segment
from telescope.orchestrator.deadlines import call_with_deadline
from telescope.schema.config import TelescopeConfig
from telescope.system.timeouts import OperationTimeout

#: generate(token ids of the whole trajectory so far, max_tokens, turn_index) -> Generation
GenerateFn = Callable[[list[int], int, int], Awaitable[Generation]]


@dataclass(frozen=True)
class RolloutLimits:
    max_tokens: int
    max_model_len: int
    interleaved: bool = True
    #: seconds ``compute_reward`` may take (None: no limit)
    reward_timeout_s: float | None = None
    #: seconds ``env_response`` or ``is_done`` may take (None: no limit)
    environment_step_timeout_s: float | None = None

    @classmethod
    def from_config(cls, config: TelescopeConfig) -> RolloutLimits:
        """The limits of a training rollout."""
        return cls(
            config.max_tokens,
            config.max_model_len,
            config.interleaved_rollouts,
            config.reward_timeout_s,
            config.environment_step_timeout_s,
        )


class Lane:
    """A generation slot; released once (after generation or at the end, whichever first)."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release = release
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._release()


async def run_rollout(
    environment: EnvironmentBase,
    sample: Sample,
    messages: list[Message],
    prompt_ids: list[int],
    *,
    renderer: ChatRenderer,
    generate: GenerateFn,
    policy_version: Callable[[], int],
    limits: RolloutLimits,
    lane: Lane | None = None,
    free_lane_after_generation: bool = True,
    compactor: Compactor | None = None,
) -> Rollout:
    """Run one rollout to completion and score it; environment errors are contained.

    With a ``compactor`` a multi-turn episode whose context fills is compacted and goes on
    in a new context segment (:mod:`telescope.orchestrator.compaction`); the closed segments
    become ``Rollout.segments``.
    """
    multi_turn = isinstance(environment, MultiTurnEnvironment)
    segment = Segment(
        turns=[], conversation=[dict(m) for m in messages], pending_ids=list(prompt_ids), last_exchange=None
    )
    closed: list[list[Turn]] = []
    compaction = (
        EpisodeCompaction(compactor, messages, renderer, max_tokens=limits.max_tokens, interleaved=limits.interleaved)
        if compactor is not None and multi_turn
        else None
    )
    state: RolloutState | None = None
    error: str | None = None
    where = f"of sample {sample.sample_id!r} ({sample.environment or type(environment).__name__})"

    def turn_index() -> int:
        return sum(len(turns) for turns in closed) + len(segment.turns)

    async def generate_turn(context: list[int], input_ids: list[int], budget: int) -> Turn:
        dispatched_version = policy_version()
        # the server sees the whole segment so far: earlier turns' tokens exactly as they were
        with events.context(turn=turn_index()):
            generation = await generate(context + input_ids, budget, turn_index())
        return Turn(
            input_token_ids=input_ids,
            output_token_ids=list(generation.token_ids),
            output_logprobs=list(generation.logprobs),
            policy_version=dispatched_version,
            finish_reason=generation.finish_reason,
            output_text=renderer.decode(generation.token_ids),
            output_policy_versions=token_versions(generation),
        )

    try:
        if isinstance(environment, MultiTurnEnvironment):  # off the loop, timed: it may load a page, start a sandbox
            state = await call_with_deadline(
                "environment_step",
                f"initial_state {where}",
                limits.environment_step_timeout_s,
                environment.initial_state,
                sample,
            )
        while True:
            if compaction is not None and compaction.due(segment.used):
                compacted = await compaction.compact(segment, generate_turn)
                if compacted is not None:
                    closed.append(compacted.closed)
                    segment = Segment([], compacted.messages, compacted.input_ids, None)
            limit = compaction.limit if compaction is not None else limits.max_model_len
            budget = min(limits.max_tokens, limit - segment.used)
            if budget <= 0:
                if segment.turns:
                    segment.turns[-1] = dataclasses.replace(segment.turns[-1], finish_reason="length")
                break
            turn = await generate_turn(segment.context_ids, segment.pending_ids, budget)
            segment.turns.append(turn)
            segment.pending_ids = []
            reply: Message = {"role": "assistant", "content": turn.output_text}
            if not multi_turn or state is None:
                segment.conversation.append(reply)
                break
            history = list(segment.conversation)
            segment.conversation.append(reply)
            segment.last_exchange = Exchange(history, reply, list(turn.output_token_ids))
            state.turn += 1
            assert isinstance(environment, MultiTurnEnvironment)
            if turn.finish_reason == "length":  # cut by max_tokens (compaction never cuts a reply): the episode ends
                break
            step_limit = limits.environment_step_timeout_s
            conversation = segment.conversation
            if await call_with_deadline(
                "environment_step", f"is_done {where}", step_limit, environment.is_done, conversation, state
            ):
                break
            with events.context(turn=turn_index() - 1):  # the reply to this turn (its tool calls, sandboxes)
                new_messages = await call_with_deadline(
                    "environment_step",
                    f"env_response {where}",
                    step_limit,
                    environment.env_response,
                    conversation,
                    state,
                )
            if limits.interleaved:
                segment.pending_ids = renderer.continuation_ids(
                    history, reply, list(turn.output_token_ids), new_messages
                )
                conversation.extend(new_messages)
            else:
                conversation.extend(new_messages)
                full = renderer.prompt_ids(conversation)
                previous = len(segment.context_ids)
                # Re-tokenized: the earlier turns' tokens are whatever the template now gives.
                segment.pending_ids = full[previous:] if len(full) > previous else []
    except (asyncio.CancelledError, ServerUnavailable):
        raise  # cancelled, or re-dispatched elsewhere by the scheduler
    except OperationTimeout as exc:  # a hung environment step or request: this rollout only
        error = str(exc)
    except Exception as exc:  # an environment failure marks this rollout, the run goes on
        error = f"{type(exc).__name__} during generation of sample {sample.sample_id!r}: {exc} [{raised_at(exc)}]"
    finally:
        if lane is not None and free_lane_after_generation:
            lane.release()

    turns = segment.turns
    if not turns and closed:  # compacted just before the episode ended: the last closed segment is its main one
        turns = closed.pop()
    unscored = Rollout(
        sample=sample,
        turns=turns,
        messages=segment.conversation,
        error=error,
        segments=closed,
        compactions=compaction.count if compaction is not None else 0,
        compaction_failures=tuple(compaction.failures) if compaction is not None else (),
    )
    if error is None and turns:
        reward = await _score(environment, unscored, renderer, state, limits.reward_timeout_s)
    else:
        reward = RewardResult(total_reward=0.0, error=error or "no turn was generated")
    if lane is not None:
        lane.release()
    attachments = list(state.attachments) if state is not None else []
    return dataclasses.replace(unscored, reward=reward, error=reward.error, attachments=attachments)


def raised_at(exc: BaseException) -> str:
    """``raised at FILE:LINE in FUNCTION``: the innermost frame of ``exc``'s traceback (where it was raised)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "raised at an unknown place"
    last = frames[-1]
    return f"raised at {last.filename}:{last.lineno} in {last.name}"


def token_versions(generation: Generation) -> list[int]:
    """Per generated token, the version the server reports (its start version for all if it gave none)."""
    versions = generation.token_policy_versions
    if versions is not None and len(versions) == len(generation.token_ids):
        return list(versions)
    if generation.policy_version_start is not None:
        return [generation.policy_version_start] * len(generation.token_ids)
    return []


async def _score(
    environment: EnvironmentBase,
    rollout: Rollout,
    renderer: ChatRenderer,
    state: object,
    timeout_s: float | None = None,
) -> RewardResult:
    """The rollout's reward (errors and timeouts contained), as one ``reward.compute`` event."""
    start, t0 = time.time(), time.perf_counter()
    result = await _compute_reward(environment, rollout, renderer, state, timeout_s)
    events.emit(
        "reward.compute",
        start=start,
        duration_s=time.perf_counter() - t0,
        component="orchestrator",
        sample_id=rollout.sample.sample_id,
        environment=rollout.sample.environment,
        reward=float(result.total_reward),
        error=result.error,
    )
    return result


async def _compute_reward(
    environment: EnvironmentBase,
    rollout: Rollout,
    renderer: ChatRenderer,
    state: object,
    timeout_s: float | None = None,
) -> RewardResult:
    sample = rollout.sample
    what = f"compute_reward of sample {sample.sample_id!r} ({sample.environment or type(environment).__name__})"
    try:
        if isinstance(environment, BaseEnvironment):
            result = await call_with_deadline(
                "reward",
                what,
                timeout_s,
                environment.compute_reward,
                rollout.completion_text,
                sample,
                renderer.eos_token,
            )
        elif isinstance(environment, MultiTurnEnvironment):
            result = await call_with_deadline(
                "reward", what, timeout_s, environment.compute_reward, rollout.messages, sample, state
            )
        else:
            raise TypeError(f"{type(environment).__name__} is neither a single- nor a multi-turn environment")
        if not isinstance(result, RewardResult):
            raise TypeError(f"compute_reward returned {type(result).__name__}, not RewardResult")
        reward = float(result.total_reward)
        if reward != reward or reward in (float("inf"), float("-inf")):
            raise ValueError(f"compute_reward returned a non-finite reward ({reward})")
        return result
    except OperationTimeout as exc:  # a hung reward function: abandoned, counted, the run goes on
        return RewardResult(total_reward=0.0, error=str(exc))
    except Exception as exc:  # a failing reward function is contained and counted
        return RewardResult(total_reward=0.0, error=f"{type(exc).__name__} in {what}: {exc} [{raised_at(exc)}]")


async def all_or_none(coroutines: list[Awaitable[Rollout]]) -> list[Rollout]:
    """Every rollout of a group, or, when one raises, none: the others are cancelled and awaited."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
