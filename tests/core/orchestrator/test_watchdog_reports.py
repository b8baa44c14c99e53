"""The watchdog over fake services: it names what is stuck (a server, the trainer, an environment
call, a sandbox command) in its error and in status.json, and fails the run.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from telescope.api import events
from telescope.api.records import RewardResult, Sample, TrainingBatch
from telescope.inference.generation import Generation, SamplingSettings
from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.watchdog import StuckError
from telescope.recording.run_reader import RunReader

from .fakes import FakeServices, ParityEnvironment
from .fault_loop import HANG_GUARD, run_loop, status

pytestmark = pytest.mark.timeout(120)

#: Released at the end of the module, so that the threads of hung calls end too.
RELEASE = threading.Event()


@pytest.fixture(scope="module", autouse=True)
def release_hung_calls() -> Iterator[None]:
    yield
    RELEASE.set()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(PRESETS["test"])


class HangingReward(ParityEnvironment):
    """Parity, but compute_reward hangs (until the module ends) for completions of a length divisible by 4."""

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        if len(completion) % 4 == 0:
            RELEASE.wait()
        return super().compute_reward(completion, sample, eos_token)


class HangingServer(FakeServices):
    """Server 1 never answers (its requests hang) from the start."""

    async def generate(
        self,
        server: int,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        seed: int,
        priority: int,
        sampling: SamplingSettings,
    ) -> Generation:
        if server == 1:
            await asyncio.sleep(3600)
        return await super().generate(server, prompt_ids, max_tokens, seed=seed, priority=priority, sampling=sampling)


@HANG_GUARD
def test_the_watchdog_names_a_server_that_does_not_answer(tmp_path: Path, tokenizer: Any) -> None:
    services = HangingServer(servers=2)

    async def probe() -> list[dict[str, Any]]:
        return [
            {"component": "inference_server", "server": 0, "ok": True, "detail": "server 0 answers"},
            {
                "component": "inference_server",
                "server": 1,
                "ok": False,
                "url": "http://fake:1",
                "detail": "inference server 1 (http://fake:1) does not answer /health",
            },
        ]

    services.probe = probe  # type: ignore[attr-defined]
    with pytest.raises(StuckError) as stuck:
        run_loop(tmp_path, tokenizer, services, watchdog_timeout_s=1.0)
    assert "nothing progressed for" in str(stuck.value) and "inference server 1" in str(stuck.value)
    assert "waiting for the groups of step" in str(stuck.value)
    recorded = status(RunReader(tmp_path / "run"))["stuck"]
    assert recorded["component"] == "inference_server" and recorded["server"] == 1


def test_the_watchdog_names_in_flight_groups_without_probes(tmp_path: Path, tokenizer: Any) -> None:
    with pytest.raises(StuckError, match=r"inference server 1: \d+ group\(s\) in flight"):
        run_loop(tmp_path, tokenizer, HangingServer(servers=2), watchdog_timeout_s=1.0)


class HangingTrainer(FakeServices):
    async def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        if batch.step == 1:
            await asyncio.sleep(3600)
        return await super().train_step(batch)


def test_the_watchdog_names_the_trainer(tmp_path: Path, tokenizer: Any) -> None:
    with pytest.raises(StuckError, match="the trainer ranks have not finished training step 1"):
        run_loop(tmp_path, tokenizer, HangingTrainer(), watchdog_timeout_s=1.0)
    assert status(RunReader(tmp_path / "run"))["stuck"]["component"] == "trainer"


def test_the_watchdog_names_an_environment_call_with_no_limit(tmp_path: Path, tokenizer: Any) -> None:
    with pytest.raises(StuckError, match=r"stuck: compute_reward of sample 'q\d+' \(parity\) has not returned"):
        run_loop(
            tmp_path,
            tokenizer,
            FakeServices(),
            HangingReward,
            reward_timeout_s=None,
            watchdog_timeout_s=1.0,
            max_concurrent_prompts_per_server=1,
        )
    stuck = status(RunReader(tmp_path / "run"))["stuck"]
    assert stuck["component"] == "environment" and "group_id" in stuck and "sample_id" in stuck


class HangingSandbox(ParityEnvironment):
    """Parity whose reward runs a sandbox command that never returns (for one sample)."""

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        if sample.sample_id == "q5":
            with events.timed(
                "sandbox.execute",
                component="sandbox",
                provider="local",
                sandbox_id="sbx-7",
                command="python solution.py",
            ):
                RELEASE.wait()
        return super().compute_reward(completion, sample, eos_token)


def test_the_watchdog_names_a_sandbox_command_that_does_not_return(tmp_path: Path, tokenizer: Any) -> None:
    # 40 steps x 3 groups: q5 is drawn within the first epoch of the 40 prompts, and its reward never returns
    with pytest.raises(StuckError, match=r"stuck: sandbox sbx-7 \(local\): sandbox.execute has not returned") as stuck:
        run_loop(
            tmp_path,
            tokenizer,
            FakeServices(),
            HangingSandbox,
            reward_timeout_s=None,
            watchdog_timeout_s=1.0,
            number_of_steps=40,
        )
    assert "command 'python solution.py'" in str(stuck.value) and "compute_reward of sample 'q5'" in str(stuck.value)
    recorded = status(RunReader(tmp_path / "run"))["stuck"]
    assert recorded["component"] == "sandbox" and recorded["sandbox_id"] == "sbx-7" and recorded["sample_id"] == "q5"
