"""Faults the loop survives or reports, over fake services (no Ray, no model).

- a reward function or an environment step that hangs is timed out, counted per step, and the run goes on;
- a request to a server that does not answer times out; one to a dead server is re-dispatched;
- a server that dies mid-run loses no group and trains none twice (its groups run elsewhere);
- a trainer failure restarts the trainer group from the last checkpoint (or fails, saying how to resume);
- a crash in the middle of a checkpoint save leaves the previous checkpoint usable: the run resumes from it;
- a run whose groups are all zero-advantage stops after a bound and says why;
- a run whose reward always raises stops after a bound with the reward's own error and where it was raised.

The watchdog's reports: test_watchdog_reports.py. The same code paths with Ray, real servers and
real trainer ranks: tests/e2e/test_faults_on_ray.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from telescope.api.environment import MultiTurnEnvironment, RolloutState
from telescope.api.records import Message, RewardResult, Sample, TrainingBatch
from telescope.inference.generation import Generation, SamplingSettings, ServerPool, ServerUnavailable
from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.deadlines import running_calls, timeout_kind
from telescope.orchestrator.group_records import NoLearningSignal
from telescope.orchestrator.group_streaks import AllRolloutsErrored
from telescope.orchestrator.orchestrator import TrainerLost
from telescope.orchestrator.rollouts import RolloutLimits, run_rollout
from telescope.orchestrator.services import TrainerFailure
from telescope.recording.run_reader import RunReader
from telescope.system.timeouts import OperationTimeout
from telescope.trainer import checkpoint as trainer_ckpt

from .fakes import FakeServices, ParityEnvironment
from .fault_loop import HANG_GUARD, run_loop, total

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


class HangingParity(ParityEnvironment):
    """Parity, but compute_reward hangs (until the module ends) for completions of a length divisible by 4."""

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        if len(completion) % 4 == 0:
            RELEASE.wait()
        return super().compute_reward(completion, sample, eos_token)


class ConstantReward(ParityEnvironment):
    """Every completion gets reward 1: every group is zero-advantage."""

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return RewardResult(total_reward=1.0)


class RaisingReward(ParityEnvironment):
    """compute_reward always raises: every rollout errors."""

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        raise KeyError("no field 'target' in this sample")


# ------------------------------------------------------------------ hangs


@HANG_GUARD
def test_a_hanging_reward_is_timed_out_counted_and_the_run_goes_on(tmp_path: Path, tokenizer: Any) -> None:
    reader = run_loop(tmp_path, tokenizer, FakeServices(), HangingParity, reward_timeout_s=0.3, number_of_steps=3)
    assert [m["step"] for m in reader.metrics()] == [0, 1, 2]
    assert total(reader, "timeouts/reward/count") > 0
    assert all(m["timeouts/environment_step/count"] == 0 for m in reader.metrics())
    hung = [r for r in reader.rollouts() if len(r["completion"]) % 4 == 0]
    assert hung == []  # a timed-out rollout is errored: it is never trained


class HangingGame(MultiTurnEnvironment):
    """A multi-turn game whose second reply never comes."""

    name = "hanging_game"
    max_turns = 3

    def load_dataset(self) -> list[Sample]:
        return [Sample(prompt="start", sample_id="0")]

    def env_response(self, messages: list[Message], state: RolloutState) -> list[Message]:
        if state.turn >= 2:
            RELEASE.wait()
        return [{"role": "user", "content": f"again {state.turn}"}]

    def compute_reward(self, messages: list[Message], sample: Sample, state: RolloutState) -> RewardResult:
        return RewardResult(total_reward=float(state.turn))


@HANG_GUARD
def test_a_hanging_environment_step_is_timed_out(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    env = HangingGame()
    sample = env.load_dataset()[0]
    messages = env.format_prompt(sample)

    async def generate(prompt_ids: list[int], max_tokens: int, turn: int) -> Generation:
        ids = [*renderer.encode("hello"), renderer.eos_token_id or 0]
        return Generation(ids, [-0.5] * len(ids), "stop", 0, 0)

    limits = RolloutLimits(max_tokens=16, max_model_len=512, environment_step_timeout_s=0.2)
    rollout = asyncio.run(
        run_rollout(
            env,
            sample,
            messages,
            renderer.prompt_ids(messages),
            renderer=renderer,
            generate=generate,
            policy_version=lambda: 0,
            limits=limits,
        )
    )
    assert timeout_kind(rollout.error) == "environment_step", rollout.error
    assert "env_response of sample '0'" in (rollout.error or "")
    assert len(rollout.turns) == 2 and rollout.reward is not None and rollout.reward.total_reward == 0.0
    assert any(c.kind == "environment_step" for c in running_calls())  # abandoned, still listed while it runs


class SlowStartGame(HangingGame):
    """A game whose episodes start with blocking work (a page to load), and one whose start raises."""

    def __init__(self) -> None:
        self.start_threads: list[int] = []

    def initial_state(self, sample: Sample) -> RolloutState:
        self.start_threads.append(threading.get_ident())
        if sample.sample_id == "broken":
            raise RuntimeError("the browser would not start")
        return super().initial_state(sample)

    def env_response(self, messages: list[Message], state: RolloutState) -> list[Message]:
        return [{"role": "user", "content": "again"}]


def test_an_episode_starts_off_the_event_loop_and_a_start_that_fails_errors_that_rollout(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    env = SlowStartGame()

    async def generate(prompt_ids: list[int], max_tokens: int, turn: int) -> Generation:
        ids = [*renderer.encode("hi"), renderer.eos_token_id or 0]
        return Generation(ids, [-0.5] * len(ids), "stop", 0, 0)

    async def rollout(sample_id: str) -> Any:
        sample = Sample(prompt="start", sample_id=sample_id)
        messages = env.format_prompt(sample)
        limits = RolloutLimits(max_tokens=8, max_model_len=512)
        return await run_rollout(
            env,
            sample,
            messages,
            renderer.prompt_ids(messages),
            renderer=renderer,
            generate=generate,
            policy_version=lambda: 0,
            limits=limits,
        )

    async def main() -> list[Any]:
        return list(await asyncio.gather(rollout("0"), rollout("broken")))

    good, broken = asyncio.run(main())  # the event loop runs on this (the main) thread
    assert len(env.start_threads) == 2 and threading.get_ident() not in env.start_threads
    assert good.error is None and len(good.turns) == 3 and good.reward.total_reward == 3.0
    assert broken.reward.total_reward == 0.0 and "RuntimeError" in (broken.error or "")
    assert "the browser would not start" in (broken.error or "") and not broken.turns


async def _silent_server() -> tuple[asyncio.AbstractServer, int]:
    """A TCP server that reads requests and never answers."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        await asyncio.sleep(3600)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@HANG_GUARD
def test_a_request_that_gets_no_answer_times_out_and_a_dead_server_is_unavailable() -> None:
    from telescope.inference.client import InferenceClient

    async def scenario() -> None:
        server, port = await _silent_server()
        silent = InferenceClient(f"http://127.0.0.1:{port}", read_timeout=0.3, server_index=0)
        dead = InferenceClient("http://127.0.0.1:9", read_timeout=0.3, server_index=1, max_retries=1)
        pool = ServerPool([silent, dead], "fcfs")
        failed: list[int] = []
        pool.on_failure = failed.append
        sampling = SamplingSettings(1.0, None)
        with pytest.raises(OperationTimeout) as timed_out:
            await pool.generate(0, [1, 2, 3], 4, seed=0, priority=0, sampling=sampling)
        assert timed_out.value.kind == "inference_request" and "inference server 0" in str(timed_out.value)
        with pytest.raises(ServerUnavailable):
            await pool.generate(1, [1, 2, 3], 4, seed=0, priority=0, sampling=sampling)
        assert failed == [1]
        pool.set_unavailable(0, "restarting")
        with pytest.raises(ServerUnavailable, match="restarting"):
            await pool.generate(0, [1, 2, 3], 4, seed=0, priority=0, sampling=sampling)
        await pool.aclose()
        server.close()

    asyncio.run(scenario())


# ----------------------------------------------------------- dead servers


class DyingServer(FakeServices):
    """Server 1 dies after a few requests, is 'restarted' (unavailable) for a while, then serves again."""

    def __init__(self) -> None:
        super().__init__(servers=2, delay_s=0.02)
        self.down_from = 12  # the request count at which server 1 dies
        self.down_until: float | None = None
        self.dead_requests = 0

    def is_available(self, server: int) -> bool:
        return not (server == 1 and self.down_until is not None and time.monotonic() < self.down_until)

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
        if server == 1 and len(self.requests) >= self.down_from and self.down_until is None:
            self.down_until = time.monotonic() + 0.5
        if server == 1 and self.down_until is not None and time.monotonic() < self.down_until:
            self.dead_requests += 1
            await asyncio.sleep(0.01)
            raise ServerUnavailable(1, "ConnectError: All connection attempts failed")
        return await super().generate(server, prompt_ids, max_tokens, seed=seed, priority=priority, sampling=sampling)


def test_the_groups_of_a_dead_server_run_elsewhere_none_lost_none_trained_twice(tmp_path: Path, tokenizer: Any) -> None:
    services = DyingServer()
    reader = run_loop(tmp_path, tokenizer, services, number_of_steps=6, max_async_rollout=1)
    assert services.dead_requests > 0
    metrics = reader.metrics()
    assert [m["step"] for m in metrics] == list(range(6))
    assert total(reader, "infra/groups_redispatched") > 0
    events = reader.events()
    redispatched = {e["group_id"] for e in events if e["kind"] == "orchestrator.group_redispatched"}
    assert redispatched and all(e["server"] == 1 for e in events if e["kind"] == "orchestrator.group_redispatched")
    # every dispatched group ends once: trained, discarded or canceled; a re-dispatched one too
    dispatched = {e["group_id"] for e in events if e["kind"] == "orchestrator.group_dispatched"}
    ends = [
        e["group_id"]
        for e in events
        if e["kind"] in ("orchestrator.group_completed", "orchestrator.group_discarded", "orchestrator.group_canceled")
    ]
    assert sorted(ends) == sorted(dispatched)
    assert redispatched <= {e["group_id"] for e in events if e["kind"] == "orchestrator.group_completed"} | set(
        e["group_id"] for e in events if e["kind"] in ("orchestrator.group_discarded", "orchestrator.group_canceled")
    )
    # no prompt trained twice: 6 steps x 3 groups x 4 rollouts, 18 distinct prompts
    prompts = [r["sample_id"] for r in reader.rollouts()]
    assert len(prompts) == 6 * 3 * 4 and len(set(prompts)) == 6 * 3


class DyingUnderLoad(DyingServer):
    """Server 1 dies while it holds several groups: every request it has in flight then fails."""

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
        if server == 1 and len(self.requests) >= self.down_from and self.down_until is None:
            self.down_until = time.monotonic() + 0.5
        answer = await FakeServices.generate(
            self, server, prompt_ids, max_tokens, seed=seed, priority=priority, sampling=sampling
        )
        if server == 1 and self.down_until is not None and time.monotonic() < self.down_until:
            self.dead_requests += 1
            raise ServerUnavailable(1, "ConnectError: All connection attempts failed")
        return answer


def test_a_dead_server_is_one_line_in_the_log_however_many_groups_it_held(
    tmp_path: Path, tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    services = DyingUnderLoad()
    services.delay_s = 0.1
    with caplog.at_level("DEBUG", logger="telescope.orchestrator"):
        reader = run_loop(tmp_path, tokenizer, services, number_of_steps=4, max_async_rollout=3)
    redispatched = [e for e in reader.events() if e["kind"] == "orchestrator.group_redispatched"]
    assert len(redispatched) > 1  # each group is an event...
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "inference server 1" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # ...the death one line


# -------------------------------------------------------- trainer failures


class FailingTrainer(FakeServices):
    """train_step raises TrainerFailure once, at ``fail_at``; restart_trainer counts restarts."""

    def __init__(self, fail_at: int, restartable: bool = True) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.failed = False
        self.restarts = 0
        self.can_restart_trainer = restartable  # type: ignore[misc]

    async def train_step(self, batch: TrainingBatch) -> dict[str, float]:
        if batch.step == self.fail_at and not self.failed:
            self.failed = True
            raise TrainerFailure("trainer rank 0 died", RuntimeError("ActorDiedError"))
        return await super().train_step(batch)

    async def restart_trainer(self) -> None:
        self.restarts += 1

    def fault_metrics(self) -> dict[str, float]:
        return {"infra/server_restarts": 0.0}


def test_a_trainer_failure_restarts_from_the_last_checkpoint(tmp_path: Path, tokenizer: Any) -> None:
    straight = run_loop(tmp_path / "straight", tokenizer, FakeServices(), number_of_steps=6)
    services = FailingTrainer(fail_at=4)
    reader = run_loop(tmp_path / "failing", tokenizer, services, number_of_steps=6, checkpoint_every=2)
    assert services.restarts == 1
    # steps 0-3 trained, the failure at 4, then 4-5 again from checkpoint 4: the same prompts as a straight run
    assert [b.step for b in services.batches] == [0, 1, 2, 3, 4, 5]
    assert services.pushed[-3:] == [4, 5, 6]

    def prompts(run: RunReader) -> dict[int, list[str]]:
        by_step: dict[int, list[str]] = {}
        for record in run.rollouts():
            by_step.setdefault(record["step"], []).append(record["sample_id"])
        return {step: sorted(ids) for step, ids in by_step.items()}

    assert prompts(reader) == prompts(straight)
    metrics = reader.metrics()
    assert metrics[-1]["infra/trainer_restarts"] == 1.0 and "infra/server_restarts" in metrics[-1]
    restart = [e for e in reader.events() if e["kind"] == "orchestrator.trainer_restart"]
    assert len(restart) == 1 and restart[0]["checkpoint"].endswith("step_00000004")


def test_the_rows_of_steps_trained_again_after_a_restart_read_as_abandoned(tmp_path: Path, tokenizer: Any) -> None:
    # checkpoint 4 is saved after step 3; step 4 is recorded, step 5 fails: the restart trains 4 again
    reader = run_loop(tmp_path, tokenizer, FailingTrainer(fail_at=5), number_of_steps=6, checkpoint_every=2)
    attempts = [(a.attempt, a.start_step, a.reason) for a in reader.attempts()]
    assert attempts == [(0, 0, "start"), (1, 4, "trainer_restart")]
    assert [m["step"] for m in reader.metrics()] == [0, 1, 2, 3, 4, 5]
    every = reader.metrics(include_abandoned=True)
    assert [(m["step"], m["attempt"]) for m in every] == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (4, 1), (5, 1)]
    assert {m["attempt"] for m in reader.metrics() if m["step"] >= 4} == {1}
    assert reader.latest_metrics()[4]["attempt"] == 1
    rollouts = reader.rollouts()
    assert {r["attempt"] for r in rollouts if r["step"] == 4} == {1}
    abandoned = [r for r in reader.rollouts(include_abandoned=True) if r not in rollouts]
    assert abandoned and {(r["step"], r["attempt"]) for r in abandoned} == {(4, 0)}
    status = reader.status()
    assert status is not None and status["attempt"] == 1


def test_a_resumed_run_says_from_which_step_and_starts_an_attempt(
    tmp_path: Path, tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    run_loop(tmp_path, tokenizer, FakeServices(), number_of_steps=4, checkpoint_every=2)
    with caplog.at_level("INFO", logger="telescope.orchestrator"):
        reader = run_loop(
            tmp_path, tokenizer, FakeServices(), number_of_steps=6, checkpoint_every=2, resume_from_checkpoint=2
        )
    assert any(r.getMessage().startswith("resuming from step 2 ") for r in caplog.records)
    assert [(a.attempt, a.start_step, a.reason) for a in reader.attempts()] == [(0, 0, "start"), (1, 2, "resume")]
    assert [(m["step"], m["attempt"]) for m in reader.metrics()] == [(0, 0), (1, 0), (2, 1), (3, 1), (4, 1), (5, 1)]


def test_a_trainer_failure_without_a_checkpoint_fails_the_run_saying_why(tmp_path: Path, tokenizer: Any) -> None:
    with pytest.raises(TrainerLost, match="checkpoints are off") as lost:
        run_loop(tmp_path, tokenizer, FailingTrainer(fail_at=1), number_of_steps=4)
    assert lost.value.checkpoint is None
    with pytest.raises(TrainerLost, match="trainer_max_restarts: 0") as exhausted:
        run_loop(
            tmp_path / "b",
            tokenizer,
            FailingTrainer(fail_at=3),
            number_of_steps=4,
            checkpoint_every=2,
            trainer_max_restarts=0,
        )
    assert exhausted.value.checkpoint is not None and exhausted.value.checkpoint.name == "step_00000002"


def test_a_training_service_that_cannot_restart_its_ranks_fails_the_run_saying_so(
    tmp_path: Path, tokenizer: Any
) -> None:
    """The capability is the service's typed default (``can_restart_trainer``), not a probed attribute."""
    services = FailingTrainer(fail_at=3, restartable=False)
    with pytest.raises(TrainerLost, match="this training service cannot restart its ranks"):
        run_loop(tmp_path, tokenizer, services, number_of_steps=4, checkpoint_every=2)
    assert services.restarts == 0


# ------------------------------------------------------ checkpoint crashes


class CrashingSave(FakeServices):
    """Saving checkpoint ``crash_at`` fails halfway through writing its folder (a full disk, a killed rank)."""

    crash_at = 4

    async def save_checkpoint(self, step: int) -> None:
        if step != self.crash_at:
            return await super().save_checkpoint(step)
        assert self.checkpoint_root is not None

        class HalfWriting:
            def save_checkpoint(self, path: Path, *, training_state: bool = True) -> None:
                with trainer_ckpt.atomic_directory(path, is_main=True) as tmp:
                    (tmp / "model.safetensors").write_bytes(b"the first bytes of the weights")
                    raise OSError(28, "No space left on device")

        trainer_ckpt.TrainerCheckpoints(self.checkpoint_root, every=1).save(HalfWriting(), step)  # type: ignore[arg-type]


def test_a_crash_during_a_checkpoint_save_leaves_the_previous_one_usable(tmp_path: Path, tokenizer: Any) -> None:
    with pytest.raises(OSError, match="No space left"):
        run_loop(tmp_path, tokenizer, CrashingSave(), number_of_steps=6, checkpoint_every=2)
    root = tmp_path / "run" / "checkpoints"
    assert trainer_ckpt.latest_checkpoint(root) == root / "step_00000002"
    assert (root / trainer_ckpt.LATEST).read_text().strip() == "step_00000002"
    assert not (root / "step_00000004").exists() and (root / ".step_00000004.tmp").exists()
    # the run resumes from the previous checkpoint and completes; the next save replaces the leftover
    services = FakeServices()
    reader = run_loop(tmp_path, tokenizer, services, number_of_steps=6, checkpoint_every=2, resume_from_checkpoint=True)
    assert [b.step for b in services.batches] == [2, 3, 4, 5]
    assert trainer_ckpt.latest_checkpoint(root) == root / "step_00000006"
    assert not any(p.name.endswith(".tmp") for p in root.iterdir())
    assert reader.status()["status"] != "failed"


# --------------------------------------------------- no batch, no progress


@HANG_GUARD
def test_a_run_whose_groups_are_all_zero_advantage_stops_and_says_why(tmp_path: Path, tokenizer: Any) -> None:
    with pytest.raises(NoLearningSignal) as stopped:
        run_loop(tmp_path, tokenizer, FakeServices(), ConstantReward, max_consecutive_zero_advantage_batches=2)
    message = str(stopped.value)
    assert "the last 6 groups" in message and "zero-advantage" in message and "reward: 1" in message
    assert "max_consecutive_zero_advantage_batches" in message


def test_a_run_whose_reward_always_raises_stops_with_the_rewards_error(tmp_path: Path, tokenizer: Any) -> None:
    services = FakeServices()
    with pytest.raises(AllRolloutsErrored) as stopped:
        run_loop(tmp_path, tokenizer, services, RaisingReward, max_consecutive_errored_batches=2)
    assert services.batches == []  # nothing trained: every group was empty
    message = str(stopped.value)
    assert "every rollout of the last 6 groups (2 x prompts_batch_size_for_trainer 3) errored" in message
    assert "environment 'parity'" in message and "KeyError in compute_reward of sample" in message
    assert "no field 'target' in this sample" in message
    raised = RaisingReward.compute_reward.__code__
    assert f"raised at {raised.co_filename}:{raised.co_firstlineno + 1} in compute_reward" in message
    assert "max_consecutive_errored_batches" in message, message


def test_a_reward_that_raises_for_some_samples_does_not_stop_the_run(tmp_path: Path, tokenizer: Any) -> None:
    reader = run_loop(
        tmp_path,
        tokenizer,
        FakeServices(),
        ParityEnvironment,
        max_consecutive_errored_batches=1,
        number_of_steps=3,
        environments=[{"name": "parity", "kwargs": {"fail_on": "q1"}}],
    )
    assert [m["step"] for m in reader.metrics()] == [0, 1, 2]
