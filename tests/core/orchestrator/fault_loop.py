"""The loop over fake services, run to its end or its failure, for the fault tests of this folder."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from telescope.orchestrator.assembly import build_orchestrator
from telescope.plugins.registry import PluginKind, Registrar, Registry
from telescope.recording.run_reader import RunReader
from telescope.recording.run_store import RunStore

from .fakes import FakeServices, ParityEnvironment, loop_config, plugins_for


def registry_with(environment: type) -> Registry:
    registry = Registry()
    Registrar(registry, PluginKind.ENVIRONMENT, "tests", "tests", "0")("parity", environment)
    Registrar(registry, PluginKind.ALGORITHM, "tests", "tests", "0")("grpo", "telescope.algorithms.grpo:GRPO")
    return registry


def run_loop(
    tmp_path: Path, tokenizer: Any, services: FakeServices, environment: type = ParityEnvironment, **overrides: Any
) -> RunReader:
    overrides.setdefault("advantage_norm", "group")
    config = loop_config(tmp_path, **overrides)
    services.checkpoint_root = Path(config.run_dir or "") / "checkpoints"
    store = RunStore(Path(config.run_dir or ""))
    stop_capture = store.capture_events()
    run = build_orchestrator(
        config, services, services, plugins=plugins_for(registry_with(environment)), tokenizer=tokenizer, store=store
    )
    try:
        asyncio.run(run.run())
    finally:
        run.prompts.close()
        stop_capture()
        store.close()
    return RunReader(Path(config.run_dir or ""))


def total(reader: RunReader, key: str) -> float:
    return sum(float(m.get(key, 0.0)) for m in reader.metrics())


#: A fault that is not handled shows as a hang, not as a slow test: these tests assert the event
#: (a timeout raised, the run stopped) and leave the clock to this guard, generous for a busy machine.
HANG_GUARD = pytest.mark.timeout(180)


def status(reader: RunReader) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((reader.run_dir / "status.json").read_text())
    return data
