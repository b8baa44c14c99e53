"""Telescope's loop against TRL's GRPOTrainer: same model, prompts, group size, lengths, batch.

Both train the tiny ``small`` model on compact Countdown prompts with GRPO on the
CPU for the same number of steps, with the same group size, prompts per step,
completion length, learning rate and temperature, and the same reward function.
Reported for each: samples/s and tokens/s over the training steps (start-up
excluded: Ray, servers and model loading for Telescope; trainer construction for
TRL), the whole wall time, and the ratio.

``--precision fp32`` (the default) computes in float32 on both sides;
``--precision bf16`` trains both in bfloat16 mixed precision (float32 weights):
Telescope's ``mixed_precision_dtype: bfloat16`` with its engine still generating in
float32, TRL's ``bf16=True``, where accelerate's autocast also covers generation.
Current figures: ``bench/README.md``.

Also printed, to say how far the overlap can go: TRL's time per step split into
generation (``_generate_and_score_completions``: generating and scoring the
completions) and the rest (training), and Telescope's first step and the median of
its later ones. Telescope's loop overlaps generation with training, so at best a
step costs its trainer's step, and the ratio is bounded by TRL's (generation +
training) over Telescope's steady step; the first step also waits for the first
batch. The split uses a private TRL method; where a TRL version lacks it, the split
is not printed.

``--trl-keep-freed-memory`` runs the whole benchmark (TRL runs in this process) with
the glibc settings Telescope gives its Ray workers
(:data:`telescope.runtime.ray_cluster.KEEP_FREED_MEMORY`, ``ray_worker_keep_freed_memory``),
by starting this script again with them in its environment (Telescope's command is
started without them, so its workers get them from their own setting only), so both
loops allocate alike; ``--telescope-args "..."`` appends options to Telescope's command (for example
``"--trainer_prewarm false --ray_worker_keep_freed_memory false"``, to measure without
the prewarm and the kept memory).

Before and after, one line says how many cores two busy processes got
(``cores_check.py``): a machine that gives fewer than its cores makes the figures
incomparable. Needs ``pip install trl`` (not a dependency of the project). Run by hand:
``python bench/bench_vs_trl.py --steps 10``. Speed depends on the machine and on
what else runs on it; run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cores_check import report

REPO = Path(__file__).resolve().parents[1]
ENV_KWARGS = {
    "dataset_name": "generated",
    "num_samples": 2000,
    "num_numbers": 2,
    "max_number": 9,
    "seed": 0,
    "prompt_style": "compact",
}


def run_telescope(args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    from telescope.recording.run_reader import RunReader

    run_dir = workdir / "telescope"
    env_entry = json.dumps([{"name": "countdown", "kwargs": ENV_KWARGS}])
    command = [
        sys.executable,
        "-c",
        "import sys; from telescope.cli.main import main; sys.exit(main(sys.argv[1:]))",
        "run",
        str(REPO / "configs" / "examples" / "countdown_tiny.yaml"),
        "--run_dir",
        str(run_dir),
        "--model",
        f"tiny:{args.model}",
        "--environments",
        env_entry,
        "--evals",
        "[]",
        "--warm_start_steps",
        "0",
        "--number_of_steps",
        str(args.steps),
        "--group_size",
        str(args.group_size),
        "--prompts_batch_size_for_trainer",
        str(args.prompts),
        "--max_tokens",
        str(args.max_tokens),
        "--learning_rate",
        str(args.learning_rate),
        "--discard_group_zero_advantage",
        "false",
        "--max_async_rollout",
        str(args.max_async_rollout),
        "--mixed_precision_dtype",
        "bfloat16" if args.precision == "bf16" else "null",
        *shlex.split(args.telescope_args),
    ]
    start = time.perf_counter()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "TELESCOPE_PROGRESS": "off"}
    if args.trl_keep_freed_memory:  # set for TRL only: Telescope's workers get them from their own setting
        from telescope.runtime.ray_cluster import KEEP_FREED_MEMORY

        env = {name: value for name, value in env.items() if name not in KEEP_FREED_MEMORY}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    rollouts = RunReader(run_dir).rollouts()
    steps = [m["timing_step_total"] for m in metrics]
    tokens = sum(r["total_tokens"] for r in rollouts)
    later = statistics.median(steps[1:]) if len(steps) > 1 else float("nan")
    return {
        "samples": len(rollouts),
        "tokens": tokens,
        "train_s": sum(steps),
        "wall_s": wall,
        "first_step_s": steps[0],
        "later_step_s": later,
    }


def run_trl(args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from telescope.models.tiny import resolve_model_path
    from telescope_envs.countdown import CountdownEnvironment

    start_wall = time.perf_counter()
    model_path = resolve_model_path(f"tiny:{args.model}")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    environment = CountdownEnvironment(**ENV_KWARGS)  # type: ignore[arg-type]
    samples = environment.load_dataset()[: args.steps * args.prompts]
    by_prompt = {s.prompt: s for s in samples}
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": s.prompt}]} for s in samples])
    counted = {"tokens": 0, "samples": 0}

    def reward(prompts: list, completions: list, **_: object) -> list[float]:
        out = []
        for prompt, completion in zip(prompts, completions, strict=True):
            sample = by_prompt[prompt[-1]["content"]]
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            out.append(environment.compute_reward(text, sample).total_reward)
            counted["samples"] += 1
        return out

    timing = {"train_s": 0.0}

    class Timer(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, *a: object, **k: object) -> None:
            timing["start"] = time.perf_counter()

        def on_train_end(self, *a: object, **k: object) -> None:
            timing["train_s"] = time.perf_counter() - timing["start"]

        def on_log(
            self, _args: object, _state: object, _control: object, logs: dict | None = None, **k: object
        ) -> None:
            if logs and "completions/mean_length" in logs:
                completions = args.prompts * args.group_size
                prompt_tokens = 15  # the compact prompt with the chat template is ~15 tokens
                counted["tokens"] += int(completions * (logs["completions/mean_length"] + prompt_tokens))

    config = GRPOConfig(
        output_dir=str(workdir / "trl"),
        num_generations=args.group_size,
        per_device_train_batch_size=args.prompts * args.group_size,
        max_completion_length=args.max_tokens,
        learning_rate=args.learning_rate,
        max_steps=args.steps,
        use_cpu=True,
        logging_steps=1,
        report_to="none",
        temperature=1.0,
        bf16=args.precision == "bf16",
        save_strategy="no",
        beta=0.0,
        loss_type="grpo",
        seed=0,
    )
    generation = {"s": 0.0, "calls": 0}

    class TimedGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
        """Times generation and scoring apart from the rest of each step (a private TRL method)."""

        def _generate_and_score_completions(self, *a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return super()._generate_and_score_completions(*a, **k)
            finally:
                generation["s"] += time.perf_counter() - start
                generation["calls"] += 1

    trainer = TimedGRPOTrainer(
        model=model_path,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Timer()],
    )
    trainer.train()
    result = {
        "samples": counted["samples"],
        "tokens": counted["tokens"],
        "train_s": timing["train_s"],
        "wall_s": time.perf_counter() - start_wall,
    }
    if generation["calls"]:  # a TRL version without the method never calls it: no split
        result["generation_s"] = generation["s"] / args.steps
        result["training_s"] = (timing["train_s"] - generation["s"]) / args.steps
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--model", default="small", help="tiny preset: small (0.84M) or medium (6.4M parameters)")
    parser.add_argument("--group-size", dest="group_size", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8, help="prompts (groups) per step")
    parser.add_argument("--max-tokens", dest="max_tokens", type=int, default=24)
    parser.add_argument("--learning-rate", dest="learning_rate", type=float, default=2e-4)
    parser.add_argument("--max-async-rollout", dest="max_async_rollout", type=int, default=1)
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="fp32 everywhere, or bf16 mixed precision in both trainers (float32 weights, bfloat16 compute: "
        "Telescope's mixed_precision_dtype, TRL's bf16=True). Telescope's engine still generates in float32 "
        "(model_dtype); accelerate wraps TRL's model forward in autocast, so its generation runs in bfloat16",
    )
    parser.add_argument(
        "--trl-keep-freed-memory",
        dest="trl_keep_freed_memory",
        action="store_true",
        help="run TRL (in this process) with the glibc settings Telescope gives its workers",
    )
    parser.add_argument(
        "--telescope-args", dest="telescope_args", default="", help="options appended to Telescope's command"
    )
    args = parser.parse_args()
    if args.trl_keep_freed_memory:
        from telescope.runtime.ray_cluster import KEEP_FREED_MEMORY

        if any(os.environ.get(name) != value for name, value in KEEP_FREED_MEMORY.items()):
            # glibc reads them when a process starts: start this script again with them set
            os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **KEEP_FREED_MEMORY})
    before = report("before")
    with tempfile.TemporaryDirectory() as tmp:
        results = {"telescope": run_telescope(args, Path(tmp)), "trl GRPOTrainer": run_trl(args, Path(tmp))}
    print(before)
    print(report("after"))
    print(
        f"tiny:{args.model}, {args.steps} steps x {args.prompts} prompts x {args.group_size} samples, "
        f"max_tokens {args.max_tokens}, {args.precision}"
        + (", TRL with the workers' glibc settings" if args.trl_keep_freed_memory else "")
        + (f", telescope {args.telescope_args}" if args.telescope_args else "")
    )
    print(f"{'':<18}{'samples/s':>10}{'tokens/s':>10}{'train s':>9}{'wall s':>8}")
    rates = {}
    for name, r in results.items():
        rates[name] = (r["samples"] / r["train_s"], r["tokens"] / r["train_s"])
        print(f"{name:<18}{rates[name][0]:>10.1f}{rates[name][1]:>10.0f}{r['train_s']:>9.1f}{r['wall_s']:>8.1f}")
    t, trl = rates["telescope"], rates["trl GRPOTrainer"]
    print(f"{'ratio':<18}{t[0] / trl[0]:>10.2f}{t[1] / trl[1]:>10.2f}   (telescope / trl, training steps only)")
    ours, theirs = results["telescope"], results["trl GRPOTrainer"]
    print(
        f"telescope: first step {ours['first_step_s']:.3f} s (waits for the first batch), "
        f"later steps median {ours['later_step_s']:.3f} s"
    )
    if "generation_s" in theirs:
        both = theirs["generation_s"] + theirs["training_s"]
        print(
            f"trl per step: generation and scoring {theirs['generation_s']:.3f} s, "
            f"training {theirs['training_s']:.3f} s; overlap bound "
            f"(trl step / telescope later step) {both / ours['later_step_s']:.2f}x"
        )


if __name__ == "__main__":
    main()
