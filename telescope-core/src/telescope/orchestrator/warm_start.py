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

import random
from collections.abc import Awaitable, Callable, Iterator

from telescope.api.agent import AgentEnvironment
from telescope.api.environment import MultiTurnEnvironment
from telescope.api.records import Sample, SupervisedExample
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.prompts import EnvironmentSlot

#: record(environment, sample, replies) -> the program's calls answered with ``replies``, as examples
RecordAgent = Callable[[AgentEnvironment, Sample, list[str]], Awaitable[list[SupervisedExample]]]


async def demonstration_examples(
    slots: list[EnvironmentSlot], renderer: ChatRenderer, limit: int, seed: int, record_agent: RecordAgent | None = None
) -> list[SupervisedExample]:
    """Up to ``limit`` (prompt ids, completion ids) examples from the environments' demonstrations.

    An agent environment's demonstration is its program run with a policy that answers its
    ``demonstration_replies``: ``record_agent`` runs it, and each recorded call is an example.
    """
    rng = random.Random(seed)
    examples: list[SupervisedExample] = []
    eos = renderer.eos_token_id
    candidates = [(slot, index) for slot in slots for index in slot.usable]
    rng.shuffle(candidates)
    for slot, index in candidates:
        sample = slot.samples[index]
        environment = slot.environment
        if isinstance(environment, AgentEnvironment):
            replies = environment.demonstration_replies(sample)
            if replies is not None and record_agent is not None:
                examples.extend(await record_agent(environment, sample, replies))
        elif isinstance(environment, MultiTurnEnvironment) and (turns := environment.demonstration_turns(sample)):
            examples.extend(played_demonstration(environment, sample, turns, renderer))
        else:
            demo = environment.demonstration(sample)
            if demo is None:
                continue
            completion = renderer.encode(demo) + ([eos] if eos is not None else [])
            examples.append(SupervisedExample(renderer.prompt_ids(environment.format_prompt(sample)), completion))
        if len(examples) >= limit:
            break
    if not examples:
        names = ", ".join(s.name for s in slots)
        raise ValueError(
            f"warm_start_steps={limit and 'set'} but no environment ({names}) provides demonstrations; "
            "set warm_start_steps: 0"
        )
    return examples


def played_demonstration(
    environment: MultiTurnEnvironment, sample: Sample, replies: list[str], renderer: ChatRenderer
) -> list[SupervisedExample]:
    """One example per reply (``demonstration_turns``), each after the conversation before it.

    The replies are played against the environment (:meth:`MultiTurnEnvironment.play_replies`),
    never compacted, so they should cover the turns that fit in ``max_model_len``.
    """
    eos = [renderer.eos_token_id] if renderer.eos_token_id is not None else []
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
