"""Code tracker: a long-horizon multi-turn task, longer than the context, with a running state.

An episode is ``num_turns`` exchanges (32 by default). The prompt gives a two-digit
code; every later message either gives a new code (``new 83``) or says ``same``; the
model answers each message with the code in force, in brackets (``[83]``). A turn is
right when its answer is the current code. The state that matters is one number,
but it lives in the conversation: after a compaction that drops the turn where the
code was announced, only the model's own recent answers still carry it.

Why it needs compaction. At about 18 tokens an exchange (ChatML, the tiny model's
tokenizer), 32 turns are more than twice the ``max_model_len`` of the tiny example
(256): without compaction an episode is cut where its context fills (turn 12) and the
turns it never reached count as wrong, so its reward cannot pass about a third. With ``compaction: sliding`` the
episode goes on in new context segments, each keeping the prompt and the last
``compaction_keep_turns`` exchanges, and every turn can be answered.

What is learned. The warm start's demonstrations answer the first ``demonstrated_turns``
turns (4) of an episode, in one uncompacted context: the format, and the code to give.
The rest of the episode (turn 5 to 32, the longer contexts, and every context segment
after a compaction, which starts from the prompt and two exchanges) is left to RL; a
policy that repeats a stale code scores only the turns before the next change.

A reply cut by the length limit (``max_tokens``) is no answer: with compaction the
episode goes on and the same question stands; without, the episode ends there.

Reward (0..1): the share of the ``num_turns`` turns answered right. Sample metrics:
``correct`` (1 when every turn was answered right: the episode is solved, which an
eval's ``correct_rate`` counts), ``correct_turns``, ``turns_played`` (the questions answered) and ``completed``
(1 when every question was answered).

Data: generated from ``seed`` (no file, nothing downloaded): each sample's code
schedule changes with probability ``change_probability`` a turn, to a different code.
"""

from __future__ import annotations

import random
import re
from typing import ClassVar

from telescope.api.environment import MultiTurnEnvironment, RolloutState
from telescope.api.records import Message, RewardResult, Sample

_ANSWER = re.compile(r"\[\s*(\d+)\s*\]")

#: The instruction every episode starts with; the first code follows it.
RULES = "Answer each message with the current code in brackets."


def code_schedule(rng: random.Random, num_turns: int, change_probability: float) -> list[int]:
    """The code in force at each turn (turn 0 is the prompt's), two digits, changing to a different code."""
    codes = [rng.randrange(10, 100)]
    for _ in range(num_turns - 1):
        if rng.random() < change_probability:
            codes.append(rng.choice([c for c in range(10, 100) if c != codes[-1]]))
        else:
            codes.append(codes[-1])
    return codes


def answered_code(reply: str) -> int | None:
    """The code a reply gives: the last bracketed number in it, or None."""
    found = _ANSWER.findall(reply)
    return int(found[-1]) if found else None


class CodeTrackerEnvironment(MultiTurnEnvironment):
    """Answer ``num_turns`` messages with the code in force, which changes now and then."""

    name: ClassVar[str] = "code_tracker"
    max_turns: ClassVar[int] = 256
    reward_min: ClassVar[float] = 0.0
    reward_max: ClassVar[float] = 1.0
    metrics_ranges: ClassVar[dict[str, dict[str, float]]] = {
        "correct": {"min": 0.0, "max": 1.0},
        "correct_turns": {"min": 0.0, "max": 256.0},
        "turns_played": {"min": 0.0, "max": 256.0},
        "completed": {"min": 0.0, "max": 1.0},
    }

    def __init__(
        self,
        num_samples: int = 2000,
        num_turns: int = 32,
        change_probability: float = 0.3,
        seed: int = 0,
        demonstrated_turns: int = 4,
    ) -> None:
        """``demonstrated_turns``: how many first turns the warm start's demonstrations answer."""
        if not 1 <= num_turns <= self.max_turns:
            raise ValueError(f"code_tracker num_turns must be between 1 and {self.max_turns}, got {num_turns}")
        if not 0.0 <= change_probability <= 1.0:
            raise ValueError(f"code_tracker change_probability must be between 0 and 1, got {change_probability}")
        if not 1 <= demonstrated_turns <= num_turns:
            raise ValueError(
                f"code_tracker demonstrated_turns must be between 1 and num_turns ({num_turns}), "
                f"got {demonstrated_turns}"
            )
        if num_samples < 1:
            raise ValueError(f"code_tracker num_samples must be at least 1, got {num_samples}")
        self.num_samples = num_samples
        self.num_turns = num_turns
        self.change_probability = change_probability
        self.seed = seed
        self.demonstrated_turns = demonstrated_turns

    def load_dataset(self) -> list[Sample]:
        rng = random.Random(self.seed)
        samples = []
        for index in range(self.num_samples):
            codes = code_schedule(rng, self.num_turns, self.change_probability)
            samples.append(
                Sample(
                    prompt=f"{RULES} Code: {codes[0]}",
                    answer=codes,
                    sample_id=f"{self.name}-{self.seed}-{index}",
                    environment=self.name,
                )
            )
        return samples

    def demonstration_turns(self, sample: Sample) -> list[str] | None:
        """The right answers to the first ``demonstrated_turns`` turns (all within one context, uncompacted)."""
        return [f"[{code}]" for code in sample.answer[: self.demonstrated_turns]]

    def initial_state(self, sample: Sample) -> RolloutState:
        state = super().initial_state(sample)
        state.data.update(asked=0, correct=0, done=False)
        return state

    def is_done(self, messages: list[Message], state: RolloutState) -> bool:
        """Score the answer just given to the code asked; done once the last code is answered.

        The loop calls this once after every reply that ended by itself; a reply cut by
        the length limit is no answer, and the same question stands for the next reply.
        """
        codes: list[int] = state.sample.answer
        asked = state.data["asked"]
        if answered_code(str(messages[-1].get("content", ""))) == codes[asked]:
            state.data["correct"] += 1
        state.data["done"] = asked + 1 >= self.num_turns
        return bool(state.data["done"])

    def env_response(self, messages: list[Message], state: RolloutState) -> list[Message]:
        """Ask for the next code: announce it (``new N``), or say ``same``."""
        codes: list[int] = state.sample.answer
        state.data["asked"] += 1
        asked = state.data["asked"]
        return [{"role": "user", "content": f"new {codes[asked]}" if codes[asked] != codes[asked - 1] else "same"}]

    def compute_reward(self, messages: list[Message], sample: Sample, state: RolloutState) -> RewardResult:
        correct = int(state.data.get("correct", 0))
        done = bool(state.data.get("done", False))
        return RewardResult(
            total_reward=correct / self.num_turns,
            sample_metrics={
                "correct": float(correct == self.num_turns),
                "correct_turns": float(correct),
                "turns_played": float(state.data.get("asked", 0) + (1 if done else 0)),
                "completed": float(done),
            },
        )
