"""Agent environments in the whole loop: episodes through the run's gateway, merged samples, warm start, evals.

The loop runs on the in-process fakes (tests/core/orchestrator/fakes.py: random tokens
from a seeded fake server, a recording fake trainer); the program is a plain ``openai``
SDK loop of two calls, the second going on from the first.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import openai
import pytest

from telescope.api.agent import AgentEnvironment
from telescope.api.records import RewardResult, Sample
from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.plugins.registry import PluginKind, Registrar, Registry

from .fakes import FakeServices, ParityEnvironment
from .test_orchestrator import run_loop

pytestmark = pytest.mark.timeout(180)
SYSTEM = "You answer briefly."


class TwoCalls(AgentEnvironment):
    """Ask, then ask again with the reply and a follow-up; reward: the second reply is of even length."""

    name = "two_calls"

    def load_dataset(self) -> list[Sample]:
        return [Sample(prompt=f"question {i}", sample_id=f"q{i}") for i in range(12)]

    async def run(self, client: openai.AsyncOpenAI, sample: Sample) -> RewardResult:
        messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": str(sample.prompt)}]
        first = await client.chat.completions.create(model="anything", messages=messages)
        messages += [{"role": "assistant", "content": first.choices[0].message.content}]
        messages += [{"role": "user", "content": "and then?"}]
        second = await client.chat.completions.create(model="anything", messages=messages)
        even = len(second.choices[0].message.content or "") % 2 == 0
        return RewardResult(total_reward=float(even), sample_metrics={"even": float(even)})

    def demonstration_replies(self, sample: Sample) -> list[str]:
        return ["first answer", "second answer"]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(PRESETS["test"])


def registry() -> Registry:
    registry = Registry()
    Registrar(registry, PluginKind.ENVIRONMENT, "tests", "tests", "0")("two_calls", TwoCalls)
    Registrar(registry, PluginKind.ENVIRONMENT, "tests", "tests", "0")("parity", ParityEnvironment)
    Registrar(registry, PluginKind.ALGORITHM, "tests", "tests", "0")("grpo", "telescope.algorithms.grpo:GRPO")
    return registry


def test_agent_episodes_train_as_merged_samples_of_recorded_tokens(tmp_path: Path, tokenizer: Any) -> None:
    services = FakeServices()
    services, reader = run_loop(
        tmp_path,
        tokenizer,
        services,
        registry(),
        environments=[{"name": "two_calls"}],
        number_of_steps=3,
        max_tokens=12,
        max_model_len=256,
        seq_len=256,
        warm_start_steps=2,
        warm_start_batch_size=4,
        evals=[{"name": "two_calls", "num_samples": 3}],
        eval_after_training=True,
    )
    assert [b.step for b in services.batches] == [0, 1, 2]
    rollouts = reader.rollouts()
    assert rollouts and all(r["error"] is None for r in rollouts), [r["error"] for r in rollouts][:3]
    for record in rollouts:
        calls = record["agent_calls"]
        assert [c["continues"] for c in calls] == [None, 0] and [c["sequence"] for c in calls] == [0, 0]
        assert record["num_turns"] == 2 and record["segments"] == 0
    # one training sample per episode: both calls' completions trained, everything else masked
    for batch in services.batches:
        for sample in batch.samples:
            spans = [i for i in range(1, len(sample.loss_mask)) if sample.loss_mask[i] and not sample.loss_mask[i - 1]]
            assert len(spans) == 2, sample.loss_mask
    # the warm start trained on the program's calls as recorded: its instructions in every prompt
    examples = [example for batch in services.supervised for example in batch]
    assert examples and all(SYSTEM in tokenizer.decode(e.prompt_ids) for e in examples)
    assert {tokenizer.decode(e.completion_ids, skip_special_tokens=True) for e in examples} <= {
        "first answer",
        "second answer",
    }
    (after,) = [e for e in reader.evals() if e["phase"] == "after"]
    assert after["metrics"]["eval/two_calls/num_items"] == 3.0


def test_the_gateway_is_closed_with_the_run(tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from telescope.orchestrator import agent_gateway

    ports: list[int] = []
    started = agent_gateway.AgentGateway.start

    async def remember(self: agent_gateway.AgentGateway) -> agent_gateway.AgentGateway:
        gateway = await started(self)
        ports.append(gateway.port)
        return gateway

    monkeypatch.setattr(agent_gateway.AgentGateway, "start", remember)
    run_loop(tmp_path, tokenizer, FakeServices(), registry(), environments=[{"name": "two_calls"}], number_of_steps=1)
    (port,) = ports
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # nothing listens any more


def test_an_agent_eval_of_a_run_that_trains_no_agent_starts_its_own_gateway(tmp_path: Path, tokenizer: Any) -> None:
    _, reader = run_loop(
        tmp_path,
        tokenizer,
        FakeServices(),
        registry(),
        environments=[{"name": "parity"}],
        number_of_steps=1,
        max_model_len=256,
        seq_len=256,
        evals=[{"name": "two_calls", "num_samples": 2}],
        eval_after_training=True,
    )
    (after,) = [e for e in reader.evals() if e["phase"] == "after"]
    assert after["metrics"]["eval/two_calls/num_items"] == 2.0
    assert after["metrics"]["eval/two_calls/errors"] == 0.0
