"""Run the training loop over fake services in this process (used by the kill/resume test).

Usage: python run_fake_loop.py RUN_DIR STEPS CHECKPOINT_EVERY RESUME DELAY_S
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fakes import FakeServices, ParityEnvironment, loop_config, plugins_for

from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.assembly import build_orchestrator
from telescope.plugins.registry import PluginKind, Registrar, Registry
from telescope.recording.run_store import RunStore


def main() -> None:
    run_dir, steps, every, resume, delay = (
        Path(sys.argv[1]),
        int(sys.argv[2]),
        int(sys.argv[3]),
        sys.argv[4],
        float(sys.argv[5]),
    )
    config = loop_config(
        run_dir.parent,
        run_dir=str(run_dir),
        number_of_steps=steps,
        checkpoint_every=every,
        resume_from_checkpoint=resume == "resume",
        advantage_norm="group",
    )
    registry = Registry()
    Registrar(registry, PluginKind.ENVIRONMENT, "t", "t", "0")("parity", ParityEnvironment)
    Registrar(registry, PluginKind.ALGORITHM, "t", "t", "0")("grpo", "telescope.algorithms.grpo:GRPO")
    services = FakeServices(delay_s=delay, checkpoint_root=run_dir / "checkpoints")
    store = RunStore(run_dir)
    run = build_orchestrator(
        config,
        services,
        services,
        plugins=plugins_for(registry),
        tokenizer=build_tokenizer(PRESETS["test"]),
        store=store,
    )
    try:
        asyncio.run(run.run())
    finally:
        run.prompts.close()
        store.close()


if __name__ == "__main__":
    main()
