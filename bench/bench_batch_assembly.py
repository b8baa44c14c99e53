"""Benchmark batch assembly with long-tailed completion lengths (run by hand; prints a table).

    .venv/bin/python bench/bench_batch_assembly.py             # ~70 s on 2 cores
    .venv/bin/python bench/bench_batch_assembly.py --steps 60 --seeds 0,1,2

The real scheduler (:class:`~telescope.orchestrator.scheduler.RolloutScheduler`)
driven as the Orchestrator drives it (next batch, a training step, the next policy
version), over a fake generation service: each request's completion length is
drawn from a Pareto distribution (``--alpha``, seeded by the request's seed,
capped at ``--max-tokens``) and takes ``length * --token-ms`` to generate, so a
few completions are many times longer than the median; the fake trainer takes
``--train-ms`` per step. Everything else is the shipped defaults
(``max_async_rollout`` 2, ``max_off_policy_steps`` 8), with a batch of ``--batch``
groups of ``--group-size``.

For each ``batch_assembly`` mode it reports the step time (mean and median of the
wall time per step, waiting for data included), the groups trained, discarded as
too stale (``max_async``) and the rollouts cancelled in flight (the ``canceled``
metric), and the mean dispatch lag of trained groups. No model, no server: it
measures the schedule, not generation speed.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telescope.api.environment import BaseEnvironment
from telescope.api.records import RewardResult, Sample
from telescope.config.loader import load_config
from telescope.inference.generation import Generation
from telescope.models.tiny import PRESETS, build_tokenizer
from telescope.orchestrator.assembly import build_prompt_source, build_slots
from telescope.orchestrator.chat import ChatRenderer
from telescope.orchestrator.scheduler import RolloutScheduler
from telescope.orchestrator.settings import SchedulerSettings
from telescope.plugins.facade import Plugins
from telescope.plugins.manager import TelescopePluginManager
from telescope.plugins.registry import PluginKind, Registrar, Registry


class Parity(BaseEnvironment):
    """Reward 1 for an even completion length: varied rewards, no work."""

    name = "parity"

    def load_dataset(self) -> list[Sample]:
        return [Sample(prompt=f"question {i}", answer=i, sample_id=f"q{i}") for i in range(4096)]

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return RewardResult(total_reward=float(len(completion) % 2 == 0))


class LongTailedServer:
    """Completion lengths ~ Pareto(alpha) tokens, each token ``token_s`` seconds; cancellable."""

    def __init__(self, alpha: float, token_s: float, max_tokens: int) -> None:
        self.alpha, self.token_s, self.max_tokens = alpha, token_s, max_tokens
        self.version = 0

    async def __call__(self, server: int, prompt_ids: list[int], max_tokens: int, seed: int, priority: int) -> Any:
        rng = random.Random(seed)
        length = min(int(8 * rng.paretovariate(self.alpha)), self.max_tokens)
        started = self.version
        await asyncio.sleep(length * self.token_s)
        tokens = [rng.randrange(30, 120) for _ in range(min(length, 16))] + [2]
        return Generation(tokens, [-1.0] * len(tokens), "stop", started, self.version)


@dataclass
class Outcome:
    step_times: list[float]
    trained: int
    discarded: int
    canceled_rollouts: int
    mean_lag: float


def run_mode(mode: str, seed: int, args: argparse.Namespace, root: Path) -> Outcome:
    registry = Registry()
    Registrar(registry, PluginKind.ENVIRONMENT, "bench", "bench", "0")("parity", Parity)
    Registrar(registry, PluginKind.ALGORITHM, "bench", "bench", "0")("grpo", "telescope.algorithms.grpo:GRPO")
    plugins = Plugins(TelescopePluginManager(builtins=(), load_entry_points=False), registry)
    values = {
        "environments": [{"name": "parity"}],
        "group_size": args.group_size,
        "prompts_batch_size_for_trainer": args.batch,
        "max_tokens": args.max_tokens,
        "max_model_len": 4096,
        "seq_len": 4096,
        "max_concurrent_prompts_per_server": 256,
        "inference_num_workers": 2,
        "discard_group_zero_advantage": False,
        "use_wandb": False,
        "run_dir": str(root / f"{mode}-{seed}"),
        "seed": seed,
        "batch_assembly": mode,
    }
    config = load_config(None, values, check_plugins=False).config
    renderer = ChatRenderer(build_tokenizer(PRESETS["test"]))
    prompts = build_prompt_source(config, build_slots(config, plugins), renderer)
    server = LongTailedServer(args.alpha, args.token_ms / 1000, args.max_tokens)

    async def loop() -> Outcome:
        scheduler = RolloutScheduler(
            SchedulerSettings.from_config(config, renderer.vocab_size), prompts, renderer, server, [0, 1]
        )
        scheduler.start()
        times: list[float] = []
        trained = discarded = canceled = 0
        lags: list[int] = []
        try:
            for step in range(args.steps):
                start = time.perf_counter()
                batch = await scheduler.next_batch(step)
                await asyncio.sleep(args.train_ms / 1000)  # the training step
                server.version = step + 1
                await scheduler.set_policy_version(step + 1)
                stats = scheduler.take_stats()
                times.append(time.perf_counter() - start)
                trained += len(batch)
                discarded += stats.discarded_groups
                canceled += stats.canceled_rollouts
                lags += [step - g.dispatch_version for g in batch]
        finally:
            await scheduler.close()
        return Outcome(times, trained, discarded, canceled, statistics.mean(lags))

    try:
        return asyncio.run(loop())
    finally:
        prompts.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--batch", type=int, default=8, help="prompts_batch_size_for_trainer")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=1.0, help="Pareto shape of lengths (lower: longer tail)")
    parser.add_argument("--token-ms", type=float, default=0.5, help="generation time per token")
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--train-ms", type=float, default=40.0, help="time of one training step")
    args = parser.parse_args()
    print(
        f"{args.steps} steps, batch {args.batch} groups of {args.group_size}, lengths 8 * Pareto({args.alpha}) "
        f"capped at {args.max_tokens} tokens, {args.token_ms} ms/token, training {args.train_ms} ms/step, "
        "max_async_rollout 2, max_off_policy_steps 8"
    )
    print(f"{'mode':>14} | seed | step s mean | step s median | trained | discarded | canceled rollouts | lag")
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            for mode in ("deterministic", "first_finished"):
                o = run_mode(mode, seed, args, Path(tmp))
                print(
                    f"{mode:>14} | {seed:>4} | {statistics.mean(o.step_times):>11.3f} | "
                    f"{statistics.median(o.step_times):>13.3f} | {o.trained:>7} | {o.discarded:>9} | "
                    f"{o.canceled_rollouts:>17} | {o.mean_lag:.2f}"
                )


if __name__ == "__main__":
    main()
