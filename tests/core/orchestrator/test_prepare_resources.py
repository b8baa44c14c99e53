"""``eager_prepare_resources``: environments prepare their resources before the first rollout.

With the flag, the orchestrator calls every training environment's
``prepare_resources()`` once, after the evaluations before training and before the
first generation request; without it, never (environments prepare lazily). A failure
stops the run, naming the environment. The i3_code environment warms its sandbox pool.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from telescope.api import events
from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.plugins.registry import PluginKind, Registrar, Registry
from telescope.recording.run_reader import RunReader

from .fakes import FakeServices, ParityEnvironment
from .test_orchestrator import run_loop

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(PRESETS["test"])


class Journal:
    """What happened, in order, across the environments and the fake server."""

    def __init__(self) -> None:
        self.entries: list[str] = []
        self.lock = threading.Lock()

    def add(self, entry: str) -> None:
        with self.lock:
            self.entries.append(entry)


def registry_with(journal: Journal, fail: bool = False) -> Registry:
    registry = Registry()

    class Prepared(ParityEnvironment):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.warm = False

        def prepare_resources(self) -> None:
            journal.add(f"prepare:{threading.current_thread() is threading.main_thread()}")
            if fail:
                raise OSError("no sandbox capacity")
            self.warm = True

        def compute_reward(self, completion: str, sample: Any, eos_token: str = "") -> Any:
            journal.add("reward")
            return super().compute_reward(completion, sample, eos_token)

    class Other(Prepared):
        name = "other"

    Registrar(registry, PluginKind.ENVIRONMENT, "tests", "tests", "0")("parity", Prepared)
    Registrar(registry, PluginKind.ENVIRONMENT, "tests", "tests", "0")("other", Other)
    Registrar(registry, PluginKind.ALGORITHM, "tests", "tests", "0")("grpo", "telescope.algorithms.grpo:GRPO")
    return registry


class JournalServices(FakeServices):
    journal: Journal | None = None

    async def generate(self, server: int, prompt_ids: list[int], max_tokens: int, **kwargs: Any) -> Any:
        assert self.journal is not None
        self.journal.add("generate")
        return await super().generate(server, prompt_ids, max_tokens, **kwargs)


def run(tmp_path: Path, tokenizer: Any, journal: Journal, fail: bool = False, **overrides: Any) -> RunReader:
    services = JournalServices()
    services.journal = journal
    environments = [{"name": "parity"}, {"name": "other"}]
    _, reader = run_loop(
        tmp_path,
        tokenizer,
        services,
        registry_with(journal, fail),
        environments=environments,
        number_of_steps=2,
        **overrides,
    )
    return reader


def test_with_the_flag_each_environment_prepares_once_before_the_first_rollout(tmp_path: Path, tokenizer: Any) -> None:
    journal = Journal()
    seen: list[dict[str, Any]] = []
    unsubscribe = events.subscribe(seen.append)
    try:
        reader = run(tmp_path, tokenizer, journal, eager_prepare_resources=True)
    finally:
        unsubscribe()
    first_generate = journal.entries.index("generate")
    prepares = [i for i, e in enumerate(journal.entries) if e.startswith("prepare")]
    assert len(prepares) == 2 and max(prepares) < first_generate  # both environments, before any request
    assert all(journal.entries[i] == "prepare:False" for i in prepares)  # in worker threads
    prepared = [e for e in seen if e["kind"] == "orchestrator.prepare_resources"]
    assert sorted(e["environment"] for e in prepared) == ["other", "parity"]
    assert all(e["component"] == "orchestrator" and e["duration_s"] >= 0 for e in prepared)
    assert len(reader.metrics()) == 2


def test_without_the_flag_nothing_is_prepared_up_front(tmp_path: Path, tokenizer: Any) -> None:
    journal = Journal()
    run(tmp_path, tokenizer, journal)
    assert not any(e.startswith("prepare") for e in journal.entries)
    assert "reward" in journal.entries


def test_a_failing_preparation_stops_the_run_naming_the_environment(tmp_path: Path, tokenizer: Any) -> None:
    journal = Journal()
    with pytest.raises(RuntimeError, match=r"environment '(parity|other)': prepare_resources\(\) failed.*no sandbox"):
        run(tmp_path, tokenizer, journal, fail=True, eager_prepare_resources=True)
    assert "generate" not in journal.entries


def test_i3_code_warms_its_sandbox_pool(tmp_path: Path) -> None:
    pytest.importorskip("telescope_sandbox")
    from telescope_envs.i3_code import I3CodeEnvironment

    data = Path(__file__).resolve().parents[2] / "envs" / "data" / "i3_code.jsonl"
    env = I3CodeEnvironment(dataset_name=str(data), sandbox_pool_size=2)
    try:
        assert env._pool is None
        env.prepare_resources()
        assert env._pool is not None and env._pool.idle == 2
        pool = env._pool
        env.prepare_resources()  # again: the same pool
        assert env._pool is pool
    finally:
        env.close()
