"""The run's agent gateway, and one agent episode run through it.

:class:`AgentGateway` serves the OpenAI-compatible gateway (:mod:`telescope.inference.gateway`)
inside the orchestrator's event loop, on loopback, on a free port, behind a token of its
own (a fresh 256-bit secret; the episode's client carries it). It is started when the
run has an :class:`~telescope.api.agent.AgentEnvironment` and closed with the run. The
gateway has no default backend of its own in a run: only ``/episodes/<id>/v1`` routes
answer (an episode's calls go to its group's server, so all calls of one episode, and
all episodes of one group, share that server and its prefix cache).

:func:`run_agent_episode` is one rollout of an agent environment: it opens an episode
(:class:`~telescope.orchestrator.agent_episodes.AgentEpisode`), gives the program an
``openai.AsyncOpenAI`` bound to it, awaits ``run(client, sample)`` within
``episode_timeout_s``, closes the episode, and assembles the recorded calls into the
rollout's sequences (:func:`~telescope.orchestrator.agent_episodes.assemble`). The
program's failures (it raised, timed out, or never called the model) make an errored
rollout; a server that failed under it is raised as :class:`ServerUnavailable`, so the
scheduler runs the group again elsewhere.

Why uvicorn's :class:`~uvicorn.Server` is subclassed: served in a task of the running loop,
uvicorn would install its own SIGINT/SIGTERM handlers over the run's; here it installs none.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import secrets
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from telescope.api import events
from telescope.api.agent import AgentEnvironment
from telescope.api.records import RewardResult, Rollout, Sample, SupervisedExample
from telescope.inference.gateway.app import create_gateway_app
from telescope.inference.gateway.service import Gateway
from telescope.inference.generation import Generation
from telescope.orchestrator.agent_episodes import AgentEpisode, RecordedCall, assemble
from telescope.orchestrator.rollouts import GenerateFn, Lane, RolloutLimits, raised_at

log = logging.getLogger("telescope.orchestrator")


class _LoopServer:
    """uvicorn serving in the current loop without touching the process's signal handlers."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        self.server = Server(config)
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        self.task = asyncio.create_task(self.server.serve(), name="agent-gateway")
        while not self.server.started:
            if self.task.done():
                self.task.result()
                raise RuntimeError("the agent gateway did not start")
            await asyncio.sleep(0.01)
        return int(self.server.servers[0].sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.task is not None:
            self.server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.task, 10)


class AgentGateway:
    """The gateway of a run's agent episodes (see the module docstring)."""

    def __init__(self, tokenizer: Any, *, chat_template: str | None, max_model_len: int, model_name: str) -> None:
        self.api_key = secrets.token_urlsafe(32)
        self.gateway = Gateway(
            _NoDefaultBackend(),  # type: ignore[arg-type]
            tokenizer,
            model_name=model_name,
            max_model_len=max_model_len,
            chat_template=chat_template,
            max_concurrent_requests=1 << 20,  # bounded by the scheduler's lanes, not here
        )
        self._server = _LoopServer(create_gateway_app(self.gateway, api_key=self.api_key))
        self.port = 0

    async def start(self) -> AgentGateway:

        self.port = await self._server.start()
        return self

    def client_for(self, base_url: str) -> Any:
        """An ``openai.AsyncOpenAI`` of its own for one episode's URL (the program may close it).

        Its HTTP client verifies no TLS certificates: the gateway is plain HTTP on loopback, and
        loading the CA bundle (what a default client does) costs 50 ms of CPU per episode.
        """
        import openai

        http_client = openai.DefaultAsyncHttpxClient(verify=False)
        return openai.AsyncOpenAI(base_url=base_url, api_key=self.api_key, max_retries=0, http_client=http_client)

    async def close(self) -> None:
        await self._server.close()

    @contextlib.contextmanager
    def episode(self, backend: AgentEpisode) -> Iterator[str]:
        """Serve ``backend`` for the duration; yields the episode's base URL."""
        episode_id = secrets.token_urlsafe(12)
        self.gateway.open_episode(episode_id, backend)
        try:
            yield f"http://127.0.0.1:{self.port}/episodes/{episode_id}/v1"
        finally:
            self.gateway.close_episode(episode_id)


async def start_agent_gateway(
    environments: Iterable[object], tokenizer: Any, *, chat_template: str | None, max_model_len: int, model_name: str
) -> AgentGateway | None:
    """The run's agent gateway, started, when one of ``environments`` is an agent environment; else None."""
    if not any(isinstance(environment, AgentEnvironment) for environment in environments):
        return None
    gateway = AgentGateway(tokenizer, chat_template=chat_template, max_model_len=max_model_len, model_name=model_name)
    return await gateway.start()


class _NoDefaultBackend:
    """The gateway's client in a run: only episode routes generate; the rest answer 503."""

    base_url = "(no default backend: the run's gateway serves episodes only)"

    async def health(self) -> bool:
        return True

    async def complete(self, *args: Any, **kwargs: Any) -> Any:
        from telescope.inference.client import InferenceServerError

        raise InferenceServerError(503, "this gateway serves training episodes only (/episodes/<id>/v1)")

    async def aclose(self) -> None:
        return None


async def run_agent_episode(
    environment: AgentEnvironment,
    sample: Sample,
    *,
    gateway: AgentGateway,
    generate: GenerateFn,
    policy_version: Callable[[], int],
    limits: RolloutLimits,
    lane: Lane | None = None,
    free_lane_after_generation: bool = True,
) -> Rollout:
    """One episode of ``environment`` on ``sample``, as a scored rollout (module docstring)."""
    episode = AgentEpisode(
        gateway.gateway.chat,
        generate,
        policy_version,
        max_tokens=limits.max_tokens,
        max_calls=environment.max_calls,
    )
    where = f"of sample {sample.sample_id!r} ({sample.environment or type(environment).__name__})"
    error: str | None = None
    outcome: Any = None
    start, t0 = time.time(), time.perf_counter()
    with gateway.episode(episode) as base_url:
        client = gateway.client_for(base_url)
        try:
            outcome = await asyncio.wait_for(environment.run(client, sample), environment.episode_timeout_s)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            error = f"timeout/agent: run {where} took more than episode_timeout_s={environment.episode_timeout_s}"
        except Exception as exc:  # the program's failure is this episode's, never the run's
            error = f"{type(exc).__name__} in run {where}: {exc} [{raised_at(exc)}]"
        finally:
            await client.close()
            if lane is not None and free_lane_after_generation:
                lane.release()
    if episode.server_failure is not None:
        raise episode.server_failure
    turns, segments = assemble(episode.calls)
    if error is None and not episode.calls:
        error = f"the agent's run {where} never called the model"
    reward = RewardResult(total_reward=0.0, error=error) if error is not None else _reward(outcome, where)
    events.emit(
        "agent.episode",
        start=start,
        duration_s=time.perf_counter() - t0,
        component="orchestrator",
        sample_id=sample.sample_id,
        environment=sample.environment,
        calls=len(episode.calls),
        sequences=len(segments) + (1 if turns else 0),
        reward=float(reward.total_reward),
        error=reward.error,
    )
    _emit_tool_calls(episode.calls)
    reward = dataclasses.replace(reward, sample_metrics={**episode.metrics(), **reward.sample_metrics})
    messages: list[dict[str, Any]] = []
    for call in reversed(episode.calls):  # the last chat call's conversation, its reply included
        if call.messages is not None and call.reply is not None:
            messages = [*call.messages, call.reply]
            break
    by_index = {call.index: call for call in episode.calls}
    if lane is not None:
        lane.release()
    return Rollout(
        sample=sample,
        turns=turns,
        messages=messages,
        reward=reward,
        error=reward.error,
        segments=segments,
        agent_calls=[
            call.summary(by_index.get(call.continues) if call.continues is not None else None) for call in episode.calls
        ],
    )


def _emit_tool_calls(calls: list[RecordedCall]) -> None:
    """One ``agent.tool_call`` event per tool call a reply made, from the reply's end to the call that read its result.

    The program runs its tools itself; what the gateway sees is the call asked for (in a
    reply) and its result (a ``tool`` message of a later request with that ``tool_call_id``).
    A tool call whose result no later call sent (the episode ended) is not emitted.
    """
    for call in calls:
        for tool_call in (call.reply or {}).get("tool_calls") or ():
            reader = next(
                (
                    later
                    for later in calls
                    if later.start >= call.start + call.latency_s
                    and any(
                        m.get("role") == "tool" and m.get("tool_call_id") == tool_call["id"]
                        for m in later.messages or ()
                    )
                ),
                None,
            )
            if reader is None:
                continue
            start = call.start + call.latency_s
            events.emit(
                "agent.tool_call",
                start=start,
                duration_s=max(0.0, reader.start - start),
                component="orchestrator",
                call=call.index,
                tool=tool_call["function"]["name"],
                result_read_by=reader.index,
            )


def _reward(outcome: Any, where: str) -> RewardResult:
    """``run``'s return value as a reward: a finite number or a :class:`RewardResult`."""
    if isinstance(outcome, RewardResult):
        result = outcome
    elif isinstance(outcome, int | float) and not isinstance(outcome, bool):
        result = RewardResult(total_reward=float(outcome))
    else:
        return RewardResult(
            total_reward=0.0,
            error=f"run {where} returned {type(outcome).__name__}, not a number or RewardResult",
        )
    if not math.isfinite(float(result.total_reward)):
        return RewardResult(total_reward=0.0, error=f"run {where} returned a non-finite reward ({result.total_reward})")
    return result


async def record_demonstration(
    environment: AgentEnvironment, sample: Sample, replies: list[str], *, gateway: AgentGateway, max_model_len: int
) -> list[SupervisedExample]:
    """The program's calls on ``sample`` answered with ``replies`` (in order), each as a warm-start example.

    A program that fails, or makes more calls than there are replies, gives no example (logged).
    """
    tokenizer = gateway.gateway.chat.tokenizer
    eos = tokenizer.eos_token_id

    async def answer(prompt_ids: list[int], max_tokens: int, call: int) -> Generation:
        if call >= len(replies):
            raise RuntimeError(f"the program made more calls than its {len(replies)} demonstration replies")
        ids = [*tokenizer(replies[call], add_special_tokens=False)["input_ids"], *([eos] if eos is not None else [])]
        return Generation(ids, [0.0] * len(ids), "stop")

    limits = RolloutLimits(max_tokens=max_model_len, max_model_len=max_model_len)
    rollout = await run_agent_episode(
        environment, sample, gateway=gateway, generate=answer, policy_version=lambda: 0, limits=limits
    )
    if rollout.error is not None:
        log.warning("warm start: the demonstration of sample %r gave no example: %s", sample.sample_id, rollout.error)
        return []
    examples: list[SupervisedExample] = []
    for turns in rollout.sequences:
        context: list[int] = []
        for turn in turns:
            context.extend(turn.input_token_ids)
            examples.append(SupervisedExample(list(context), list(turn.output_token_ids)))
            context.extend(turn.output_token_ids)
    return examples
