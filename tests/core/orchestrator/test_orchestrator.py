"""The orchestration logic end to end over fake services (no Ray, no model).

Asserts the loop's guarantees: synchronous mode trains only on current weights;
asynchronous mode bounds staleness; stale work is cancelled and counted; zero
advantage groups are dropped and counted; a failing reward function is contained;
the same seed gives the same metrics; eval items never reach training; a resumed
run neither skips nor repeats a prompt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from telescope import hookimpl
from telescope.inference.generation import Generation, SamplingSettings
from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.assembly import build_orchestrator
from telescope.plugins.facade import Plugins
from telescope.plugins.manager import TelescopePluginManager
from telescope.plugins.registry import PluginKind, Registrar, Registry
from telescope.recording.run_reader import RunReader
from telescope.recording.run_store import RunStore

from .fakes import FakeServices, ParityEnvironment, loop_config, plugins_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(PRESETS["test"])


def registry_with_parity(**kwargs: Any) -> Registry:
    registry = Registry()

    class Parity(ParityEnvironment):
        def __init__(self, **extra: Any) -> None:
            super().__init__(**{**kwargs, **extra})

    Registrar(registry, PluginKind.ENVIRONMENT, "tests", "tests", "0")("parity", Parity)
    Registrar(registry, PluginKind.ALGORITHM, "tests", "tests", "0")("grpo", "telescope.algorithms.grpo:GRPO")
    return registry


def run_loop(
    tmp_path: Path,
    tokenizer: Any,
    services: FakeServices | None = None,
    registry: Registry | None = None,
    **overrides: Any,
) -> tuple[FakeServices, RunReader]:
    overrides.setdefault("advantage_norm", "group")
    config = loop_config(tmp_path, **overrides)
    services = services or FakeServices()
    services.checkpoint_root = Path(config.run_dir or "") / "checkpoints"
    store = RunStore(Path(config.run_dir or ""))
    run = build_orchestrator(
        config,
        services,
        services,
        plugins=plugins_for(registry or registry_with_parity()),
        tokenizer=tokenizer,
        store=store,
    )
    try:
        asyncio.run(run.run())
    finally:
        run.prompts.close()
        store.close()
    return services, RunReader(Path(config.run_dir or ""))


def trained_versions(services: FakeServices) -> list[tuple[int, int]]:
    return [(batch.step, s.policy_version) for batch in services.batches for s in batch.samples]


def test_synchronous_mode_trains_only_on_current_weights(tmp_path: Path, tokenizer: Any) -> None:
    services, reader = run_loop(tmp_path, tokenizer, max_async_rollout=0)
    assert [b.step for b in services.batches] == [0, 1, 2, 3]
    assert all(version == step for step, version in trained_versions(services))
    assert services.pushed == [0, 1, 2, 3, 4]  # the trainer's initial weights first, then each step's
    metrics = reader.metrics()
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    for key in (
        "reward/mean",
        "advantage/std",
        "tokens/completion/mean",
        "stop_reason_length_pct",
        "group_length_gini_mean",
        "discarded/zero_advantage/count",
        "timing_step_total",
        "timing_waiting_for_data",
        "loss",
    ):
        assert key in metrics[0], key
    assert len(reader.rollouts()) == 4 * 3 * 4


def test_asynchronous_mode_bounds_staleness(tmp_path: Path, tokenizer: Any) -> None:
    services = FakeServices(delay_s=0.01)
    services, _ = run_loop(tmp_path, tokenizer, services, max_async_rollout=2, number_of_steps=6)
    lags = [step - version for step, version in trained_versions(services)]
    assert max(lags) <= 2
    assert max(lags) > 0, "with max_async_rollout=2 some samples should come from older weights"


def test_stale_in_flight_rollouts_are_cancelled_and_counted(tmp_path: Path, tokenizer: Any) -> None:
    """Requests that never finish are cancelled once the policy moves past max_off_policy_steps."""
    from telescope.orchestrator.assembly import build_prompt_source, build_slots
    from telescope.orchestrator.chat import ChatRenderer
    from telescope.orchestrator.scheduler import RolloutScheduler
    from telescope.orchestrator.settings import SchedulerSettings

    config = loop_config(
        tmp_path,
        advantage_norm="group",
        max_async_rollout=2,
        max_off_policy_steps=1,
        max_concurrent_prompts_per_server=32,
    )
    renderer = ChatRenderer(tokenizer)
    prompts = build_prompt_source(config, build_slots(config, plugins_for(registry_with_parity())), renderer)
    started: list[int] = []
    cancelled: list[int] = []

    async def never_finishes(server: int, prompt_ids: list[int], max_tokens: int, seed: int, priority: int) -> Any:
        started.append(seed)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(seed)
            raise

    async def scenario() -> tuple[int, int]:
        scheduler = RolloutScheduler(
            SchedulerSettings.from_config(config, renderer.vocab_size), prompts, renderer, never_finishes, [0, 1]
        )
        scheduler.start()
        while len(started) < 3 * 3 * 4:  # steps 0..2 (max_async_rollout=2), 3 groups of 4 each
            await asyncio.sleep(0.01)
        await scheduler.set_policy_version(1)  # dispatched at 0 >= 1 - 1: still allowed
        await asyncio.sleep(0.05)
        assert scheduler.stats.canceled_rollouts == 0
        await scheduler.set_policy_version(2)  # 0 < 2 - 1: every in-flight group is stale
        while scheduler.stats.canceled_rollouts < 36:
            await asyncio.sleep(0.01)
        canceled = scheduler.stats.canceled_rollouts
        await scheduler.close()
        return canceled, len(scheduler._in_flight)

    try:
        canceled, in_flight = asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        prompts.close()
    assert canceled == 36  # counted per rollout, whole groups
    assert len(cancelled) >= 36  # the requests themselves were cancelled (the client aborts them)
    assert in_flight == 0


def _by_group(records: list[dict[str, Any]]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    groups: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["step"], record["group_index"]), []).append(record)
    return groups


def test_zero_advantage_groups_are_discarded_and_counted(tmp_path: Path, tokenizer: Any) -> None:
    services = FakeServices(vocab=[40])  # every token decodes alike: equal lengths per group are likely
    services, reader = run_loop(tmp_path, tokenizer, services)
    discarded = sum(m["discarded/zero_advantage/groups"] for m in reader.metrics())
    assert discarded > 0
    dropped = reader.rollouts(discarded=True)  # recorded for the dashboard's Discarded page, with their reason
    assert len(dropped) == sum(m["discarded/zero_advantage/count"] for m in reader.metrics())
    assert {r["discard_reason"] for r in dropped} == {"zero_advantage"}
    for (step, group), members in _by_group(dropped).items():
        assert len({r["reward"] for r in members}) == 1, (step, group)
    assert all("discard_reason" not in r for r in reader.rollouts())
    assert len(reader.rollouts(discarded=None)) == len(reader.rollouts()) + len(dropped)
    for batch in services.batches:
        by_group: dict[int, set[float]] = {}
        for s in batch.samples:
            by_group.setdefault(s.group_index, set()).add(s.advantage)
        assert all(len(v) > 1 for v in by_group.values())


def test_a_failing_reward_function_is_contained_and_counted(tmp_path: Path, tokenizer: Any) -> None:
    registry = registry_with_parity(fail_on="q1")
    services, reader = run_loop(tmp_path, tokenizer, registry=registry, number_of_steps=6)
    assert sum(m["errors/reward_or_environment/count"] for m in reader.metrics()) > 0
    assert len(services.batches) == 6
    errored = [r for r in reader.rollouts() if r["error"]]
    assert errored == []  # errored rollouts are counted, not trained
    dropped = [r for r in reader.rollouts(discarded=True) if r["discard_reason"] == "error"]
    assert len(dropped) == sum(m["errors/reward_or_environment/count"] for m in reader.metrics())
    assert all(r["error"] for r in dropped)


def test_same_seed_same_metrics_in_synchronous_mode(tmp_path: Path, tokenizer: Any) -> None:
    def metric_values(path: Path) -> list[dict[str, float]]:
        _, reader = run_loop(path, tokenizer)
        return [
            {k: v for k, v in m.items() if not k.startswith("timing") and k not in ("time",)} for m in reader.metrics()
        ]

    assert metric_values(tmp_path / "a") == metric_values(tmp_path / "b")


def test_eval_items_never_reach_training(tmp_path: Path, tokenizer: Any) -> None:
    evals = [{"name": "parity", "num_samples": 10, "separate_eval_samples": True, "eval_every": 2}]
    services, reader = run_loop(
        tmp_path,
        tokenizer,
        evals=evals,
        eval_num_servers=1,
        number_of_steps=6,
        eval_before_training=True,
        eval_after_training=True,
    )
    trained_ids = {r["sample_id"] for r in reader.rollouts()}
    assert trained_ids and not trained_ids & {f"q{i}" for i in range(10)}
    phases = [e["phase"] for e in reader.evals()]
    assert phases[0] == "before" and phases[-1] == "after" and "periodic" in phases
    # periodic evals ran on the reserved server only; training used the other one
    training_servers = {r["server"] for r in services.requests if r["priority"] == 0}
    assert training_servers == {0, 1}


def test_each_eval_on_the_eval_server_uses_its_steps_weights(tmp_path: Path, tokenizer: Any) -> None:
    """An eval at step s runs beside training with step-s weights for every request (issue 15).

    The eval server is slow, so each periodic eval spans several training steps; pushes
    while it runs pass it by (held), and the push of the next eval's step waits for it.
    """
    services = FakeServices(server_delay_s={1: 0.2})
    evals = [{"name": "parity", "num_samples": 6, "eval_every": 2}]
    services, reader = run_loop(
        tmp_path,
        tokenizer,
        services,
        evals=evals,
        eval_num_servers=1,
        number_of_steps=7,
        max_async_rollout=1,
        eval_before_training=True,
        eval_after_training=True,
        eval_start_end_use_all_servers=False,
    )
    eval_requests = [r for r in services.requests if "eval_step" in r]
    assert {r["eval_step"] for r in eval_requests} == {0, 2, 4, 6, 7}
    assert all(r["server"] == 1 for r in eval_requests)  # the dedicated server only
    served = [(r["eval_step"], r["version"], r["end_version"]) for r in eval_requests]
    assert [v for v in served if not v[0] == v[1] == v[2]] == []
    # the eval server was held through some pushes (an eval was running), never through one an eval needed
    held = [version for version, servers in services.pushes if servers == (1,)]
    assert held and not set(held) & {2, 4, 6, 7}
    # training requests always went to the training server with the latest weights
    assert {r["server"] for r in services.requests if "eval_step" not in r} == {0}
    periodic = [e for e in reader.evals() if e["phase"] == "periodic"]
    assert [e["step"] for e in periodic] == [2, 4, 6]


def test_resume_neither_skips_nor_repeats_prompts(tmp_path: Path, tokenizer: Any) -> None:
    _, straight = run_loop(tmp_path / "straight", tokenizer, number_of_steps=6)
    run_loop(tmp_path / "resumed", tokenizer, number_of_steps=3, checkpoint_every=3)
    second, resumed = run_loop(
        tmp_path / "resumed", tokenizer, number_of_steps=6, checkpoint_every=3, resume_from_checkpoint=True
    )
    assert [b.step for b in second.batches] == [3, 4, 5]
    assert second.pushed[0] == 3  # the restored weights went to the servers first

    def prompts_by_step(reader: RunReader) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for r in reader.rollouts():
            out.setdefault(r["step"], []).append(r["sample_id"])
        return out

    assert prompts_by_step(resumed) == prompts_by_step(straight)
    state = json.loads(next((tmp_path / "resumed" / "run" / "checkpoints").glob("*.orchestrator.json")).read_text())
    assert state["step"] in (3, 6)


def test_a_fresh_run_generates_while_the_trainer_starts(tmp_path: Path, tokenizer: Any) -> None:
    services = FakeServices(trainer_start_s=0.5)
    services, _ = run_loop(tmp_path, tokenizer, services, max_async_rollout=0)
    assert services.requests_before_ready, "the servers held version 0: step 0's groups did not wait for the trainer"
    assert {r["version"] for r in services.requests[: services.requests_before_ready]} == {0}
    assert services.pushed == [0, 1, 2, 3, 4]  # version 0 is still published, once the trainer is ready
    assert all(version == step for step, version in trained_versions(services))


def test_a_trainer_that_fails_to_start_fails_the_run_and_stops_generating(tmp_path: Path, tokenizer: Any) -> None:
    failed = RuntimeError("no memory for the model")
    services = FakeServices(delay_s=0.01, trainer_start_s=0.3, trainer_start_error=failed)
    with pytest.raises(RuntimeError, match="no memory for the model"):
        run_loop(tmp_path, tokenizer, services)
    assert services.requests_before_ready and not services.batches and not services.pushed
    assert sum(services.in_flight.values()) == 0  # the scheduler was closed: nothing left generating


@pytest.mark.parametrize("start", ["warm_start", "resume"])
def test_a_warm_start_or_a_resume_waits_for_the_trainer_before_generating(
    tmp_path: Path, tokenizer: Any, start: str
) -> None:
    if start == "resume":
        run_loop(tmp_path, tokenizer, number_of_steps=3, checkpoint_every=3)
        overrides: dict[str, Any] = {"number_of_steps": 4, "checkpoint_every": 3, "resume_from_checkpoint": True}
    else:
        overrides = {"warm_start_steps": 2, "warm_start_batch_size": 2}
    services = FakeServices(trainer_start_s=0.3)
    services, _ = run_loop(
        tmp_path, tokenizer, services, registry=registry_with_parity(demonstrations=True), **overrides
    )
    assert services.requests_before_ready == 0  # the servers' weights change first: nothing generated before
    assert services.requests, "the run generated nothing"


class LaggingServer(FakeServices):
    """A server that reports its tokens as computed by the previous weights (as during an in-flight update)."""

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
        made = await super().generate(server, prompt_ids, max_tokens, seed=seed, priority=priority, sampling=sampling)
        older = max(self.version - 1, 0)
        return dataclasses.replace(made, token_policy_versions=[older] * len(made.token_ids))


def test_staleness_uses_the_token_versions_the_server_reports(tmp_path: Path, tokenizer: Any) -> None:
    services, reader = run_loop(tmp_path, tokenizer, LaggingServer(), max_async_rollout=0)
    # dispatched at the step's own version (synchronous), but the server says its tokens came from one older
    staleness = [m["policy/staleness/max"] for m in reader.metrics()]
    assert staleness == [0.0, 1.0, 1.0, 1.0]
    assert all(s.policy_version == max(b.step - 1, 0) for b in services.batches for s in b.samples)
    records = reader.rollouts(step=2)
    assert all(r["policy_version"] == 1 and r["policy_versions"] == [2] for r in records)


def test_status_json_tracks_the_step_while_the_run_goes(tmp_path: Path, tokenizer: Any) -> None:
    seen: list[tuple[int, int]] = []

    class StatusProbe:
        @hookimpl
        def telescope_step_end(self, step: int, metrics: dict[str, float]) -> None:
            status = json.loads((tmp_path / "run" / "status.json").read_text())
            seen.append((step, status["step"]))

    manager = TelescopePluginManager(builtins=(), load_entry_points=False)
    manager.register_plugin(StatusProbe(), "status-probe")
    config = loop_config(tmp_path, advantage_norm="group")
    services = FakeServices()
    store = RunStore(Path(config.run_dir or ""))
    store.set_status("running", step=0)
    run = build_orchestrator(
        config, services, services, plugins=Plugins(manager, registry_with_parity()), tokenizer=tokenizer, store=store
    )
    try:
        asyncio.run(run.run())
    finally:
        run.prompts.close()
        store.close()
    assert seen == [(0, 1), (1, 2), (2, 3), (3, 4)]
