"""Countdown as an agent program: an OpenAI Agents SDK ``Agent`` that must ask a tool for the target.

The prompt gives the numbers only (``"3 5"``); the target is known to the agent's one
function tool, ``target``, which answers the numbers and the target (``"3 5 -> 8"``).
The program is plain Agents SDK code: an ``Agent`` with instructions and the tool, run
by ``Runner.run`` with the episode's client (``OpenAIChatCompletionsModel``), as it would
run against any OpenAI-compatible server.
Its first call forces the tool (``tool_choice="target"``, which the SDK resets once the
tool ran): the gateway puts the call's opening markup in the model's mouth and the model
writes the rest. A policy that does well then reads the numbers and the target and
answers with an equation of the given numbers in ``<answer>...</answer>``.

Reward (``reward_min`` 0, ``reward_max`` 2), as Countdown's
(:func:`telescope_envs.countdown.score_answer`) on the agent's final output: format 1
(an arithmetic expression in the last ``<answer>`` block) plus correct 1 (every number
once, the target reached). A run that ends without a final output (``max_turns``
reached, or a call of a tool that does not exist: the SDK's ``MaxTurnsExceeded`` and
``ModelBehaviorError``) scores 0: it is the policy's doing, so it trains, not an error.
Sample metrics: Countdown's, ``asked_target`` (the tool was called) and ``no_answer``.

Warm start: :meth:`CountdownAgentEnvironment.demonstration_replies` gives the two replies
of a good policy (the tool call, then a solution found by exhaustive search); the warm
start runs the program with them and fine-tunes on its calls as recorded.

Data: as Countdown's ``generated`` problems (``num_samples`` solvable problems of
``num_numbers`` numbers up to ``max_number``, seeded), or a local file with ``nums`` and
``target`` columns.
"""

from __future__ import annotations

from typing import Any, ClassVar

from telescope.api.agent import AgentEnvironment
from telescope.api.records import RewardResult, Sample
from telescope_envs._data import stable_id, unique_ids
from telescope_envs.countdown import load_problems, score_answer, solve

INSTRUCTIONS = "Call target, then answer <answer>equation</answer> with each number once."
#: What the model writes of its first call: ``tool_choice`` puts the call's opening in its mouth
#: (``<tool_call>{"name": "target", "arguments": ``), so it completes the arguments and the markup.
TARGET_CALL = "{}}</tool_call>"


class CountdownAgentEnvironment(AgentEnvironment):
    """Countdown with the target behind a tool, as an Agents SDK program (see the module docstring)."""

    name: ClassVar[str] = "countdown_agent"
    metrics_ranges: ClassVar[dict[str, dict[str, float]]] = {
        "format": {"min": 0.0, "max": 1.0},
        "correct": {"min": 0.0, "max": 1.0},
        "asked_target": {"min": 0.0, "max": 1.0},
        "no_answer": {"min": 0.0, "max": 1.0},
    }
    reward_min: ClassVar[float] = 0.0
    reward_max: ClassVar[float] = 2.0
    requires: ClassVar[dict[str, str]] = {"agents": "pip install 'telescope-core[agents]'"}
    data_files: ClassVar[dict[str, tuple[str, ...]]] = {"dataset_name": ("nums", "target")}
    max_calls: ClassVar[int] = 8
    episode_timeout_s: ClassVar[float | None] = 120.0

    def __init__(
        self,
        dataset_name: str = "generated",
        dataset_split: str = "train",
        num_samples: int = 1000,
        num_numbers: int = 2,
        max_number: int = 9,
        seed: int = 0,
        max_samples: int | None = None,
        max_turns: int = 3,
    ) -> None:
        if max_turns < 2:
            raise ValueError(f"countdown_agent: max_turns must be at least 2 (ask, then answer), not {max_turns}")
        self.dataset_name = dataset_name
        self.dataset_split = dataset_split
        self.num_samples = num_samples
        self.num_numbers = num_numbers
        self.max_number = max_number
        self.seed = seed
        self.max_samples = max_samples
        self.max_turns = max_turns

    def load_dataset(self) -> list[Sample]:
        problems = load_problems(self)
        ids = unique_ids([stable_id("countdown_agent", nums, target) for nums, target in problems])
        return [
            Sample(
                prompt=" ".join(map(str, nums)),
                answer={"nums": nums, "target": target},
                sample_id=sid,
                environment=self.name,
            )
            for sid, (nums, target) in zip(ids, problems, strict=True)
        ]

    async def run(self, client: Any, sample: Sample) -> RewardResult:
        import agents

        asked: list[int] = []
        target = int(sample.answer["target"])

        def reveal() -> str:
            asked.append(1)
            return f"{sample.prompt} -> {target}"  # the numbers again, beside the target: a short copy for a tiny model

        tool = agents.function_tool(reveal, name_override="target", description_override="The target number.")
        agent = agents.Agent(
            name="countdown",
            instructions=INSTRUCTIONS,
            tools=[tool],
            model=agents.OpenAIChatCompletionsModel(model="policy", openai_client=client),
            model_settings=agents.ModelSettings(tool_choice="target"),  # the SDK resets it once the tool ran
        )
        try:
            result = await agents.Runner.run(
                agent, str(sample.prompt), max_turns=self.max_turns, run_config=agents.RunConfig(tracing_disabled=True)
            )
            output, misbehaved = str(result.final_output or ""), 0.0
        except (agents.MaxTurnsExceeded, agents.ModelBehaviorError):
            # the policy's doing (it never answered, it called a tool that does not exist): scored, not errored
            output, misbehaved = "", 1.0
        parts = score_answer(output, sample.answer["nums"], target)
        metrics = {**parts, "asked_target": float(bool(asked)), "no_answer": misbehaved}
        return RewardResult(total_reward=parts["format"] + parts["correct"], sample_metrics=metrics)

    def demonstration_replies(self, sample: Sample) -> list[str] | None:
        expression = solve(sample.answer["nums"], sample.answer["target"])
        return None if expression is None else [TARGET_CALL, f"<answer>{expression}</answer>"]
