"""Supervised warm start: the demonstrations the trainer fine-tunes on before RL.

A randomly initialised tiny model never writes a well-formed answer, so every
group gets the same (zero) reward and RL has nothing to learn from. With
``warm_start_steps > 0`` the orchestrator first has the trainer take that many
supervised steps (cross-entropy on the completion tokens only, through
:meth:`~telescope.api.trainer.TrainerBackend.supervised_step`, on every rank) on the
environments' :meth:`~telescope.api.environment.EnvironmentBase.demonstration`
completions. Evaluation "before training" runs after the warm start, so a
before/after comparison measures what the RL steps added.

This module picks the examples: eval items reserved by ``separate_eval_samples``
are excluded (they are not in a slot's usable samples), and the choice is a
deterministic function of the seed. :func:`warm_start_batches` draws each step's
batch from them (with replacement, seeded), the order the orchestrator trains on.

The learning rate matters more than the step count on a tiny model: the CPU quick
start's loss first falls to a plateau (about 0.45, well-formed answers of numbers
that are not in the prompt) and learning to copy the prompt's numbers ends it. At
3e-3 some seeds sat on it for 300 steps, and which ones depended on floating-point
rounding (the host's vector kernels); at 1.5e-3 every seed tried left it by step 100.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator

from telescope.api import events
from telescope.api.agent import AgentEnvironment
from telescope.api.environment import EnvironmentBase, MultiTurnEnvironment
from telescope.api.records import Sample, SupervisedExample
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.prompts import EnvironmentSlot

#: Samples whose demonstrations are made at once (in worker threads: a browser environment loads a page
#: for each prompt, so one at a time would keep a run's start waiting on the browser for minutes).
DEMONSTRATION_CONCURRENCY = 8

#: record(environment, sample, replies) -> the program's calls answered with ``replies``, as examples
RecordAgent = Callable[[AgentEnvironment, Sample, list[str]], Awaitable[list[SupervisedExample]]]


async def demonstration_examples(
    slots: list[EnvironmentSlot], renderer: ChatRenderer, limit: int, seed: int, record_agent: RecordAgent | None = None
) -> list[SupervisedExample]:
    """Up to ``limit`` (prompt ids, completion ids) examples from the environments' demonstrations.

    An agent environment's demonstration is its program run with a policy that answers its
    ``demonstration_replies``: ``record_agent`` runs it, and each recorded call is an example.
    The samples are taken in a seeded order, :data:`DEMONSTRATION_CONCURRENCY` at a time (the
    environments' calls in worker threads, as their rollouts' are), until ``limit`` examples.
    """
    rng = random.Random(seed)
    examples: list[SupervisedExample] = []
    candidates = [(slot, index) for slot in slots for index in slot.usable]
    rng.shuffle(candidates)

    async def examples_of(slot: EnvironmentSlot, index: int) -> list[SupervisedExample]:
        environment, sample = slot.environment, slot.samples[index]
        if isinstance(environment, AgentEnvironment):
            replies = environment.demonstration_replies(sample)
            if replies is None or record_agent is None:
                return []
            return await record_agent(environment, sample, replies)
        return await asyncio.to_thread(sample_examples, environment, sample, renderer)

    for start in range(0, len(candidates), DEMONSTRATION_CONCURRENCY):
        chunk = candidates[start : start + DEMONSTRATION_CONCURRENCY]
        for found in await asyncio.gather(*(examples_of(slot, index) for slot, index in chunk)):
            examples.extend(found)
        if len(examples) >= limit:
            break
    if not examples:
        names = ", ".join(s.name for s in slots)
        raise ValueError(
            f"warm_start_steps={limit and 'set'} but no environment ({names}) provides demonstrations; "
            "set warm_start_steps: 0"
        )
    return examples


def sample_examples(environment: EnvironmentBase, sample: Sample, renderer: ChatRenderer) -> list[SupervisedExample]:
    """The examples of one sample of a non-agent environment: its demonstration turns, or its one demonstration."""
    if isinstance(environment, MultiTurnEnvironment) and (turns := environment.demonstration_turns(sample)):
        return played_demonstration(environment, sample, turns, renderer)
    demo = environment.demonstration(sample)
    if demo is None:
        return []
    eos = [renderer.eos_token_id] if renderer.eos_token_id is not None else []
    return [SupervisedExample(renderer.prompt_ids(environment.format_prompt(sample)), renderer.encode(demo) + eos)]


def played_demonstration(
    environment: MultiTurnEnvironment, sample: Sample, replies: list[str], renderer: ChatRenderer
) -> list[SupervisedExample]:
    """One example per reply (``demonstration_turns``), each after the conversation before it.

    The replies are played against the environment (:meth:`MultiTurnEnvironment.play_replies`),
    never compacted, so they should cover the turns that fit in ``max_model_len``. What the
    environment does meanwhile (a tool's ``tool.call`` event) is recorded with the sample's id
    and ``warm_start: true``, apart from the rollouts' events.
    """
    eos = [renderer.eos_token_id] if renderer.eos_token_id is not None else []
    with events.context(sample_id=sample.sample_id, warm_start=True):
        messages, _, positions = environment.play_replies(sample, replies)
    return [
        SupervisedExample(renderer.prompt_ids(messages[:at]), renderer.encode(str(messages[at]["content"])) + eos)
        for at in positions
    ]


def warm_start_batches(
    examples: list[SupervisedExample], steps: int, batch_size: int, seed: int
) -> Iterator[list[SupervisedExample]]:
    """``steps`` batches of ``batch_size`` examples drawn with replacement, a deterministic function of the seed."""
    rng = random.Random(seed)
    for _ in range(steps):
        yield [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
