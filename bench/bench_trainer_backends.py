"""Both trainer backends on the same training step: tokens/s, step time, peak memory (and MFU on CUDA).

Run by hand::

    .venv/bin/python bench/bench_trainer_backends.py                      # tiny, CPU, both backends, recompute off/on
    .venv/bin/python bench/bench_trainer_backends.py --size small --backend megatron --recompute off
    .venv/bin/python bench/bench_trainer_backends.py --world-size 2        # FSDP DP 2 against megatron TP 2
    .venv/bin/python bench/bench_trainer_backends.py --device cuda --size 0.5b

The model is built once from a config (``bench_trainer.py``'s sizes, random weights,
nothing downloaded) and saved in the Hugging Face format; each case (a backend with
recomputation off or on) then loads it in a fresh process of its own, so neither the
imports nor the peaks of one case show in another's memory. Every case trains on the
same synthetic batches (``--groups`` x ``--group-size`` samples, a ``--prompt``-token
prompt and completions of ``--min-completion`` to ``--max-completion`` tokens, seeded
by the step), packed into rows of ``--seq-len``, in the same precision: float32 on the
CPU, bfloat16 weights and compute on CUDA (``--precision``). ``--warmup`` steps are
not timed; then ``--steps`` timed steps, each timed by the wall clock around
``train_step`` (after a device synchronisation on CUDA).

Recomputation: ``--recompute off`` sets ``gradient_checkpointing`` (FSDP) and
``megatron_gradient_checkpointing`` (megatron, true by default there) to false,
``on`` sets both true (Hugging Face's per-layer checkpointing against megatron-core's
full, uniform recomputation of every layer), ``both`` (the default) runs each.

Ranks: ``--world-size 2`` runs each case on two gloo ranks
(:func:`telescope.testing.trainer.spawn_ranks`, one thread each): the FSDP backend
data parallel over them (each rank half the batch's packed rows, the weights and Adam
states sharded), the megatron backend tensor parallel (``megatron_tensor_parallel_size
2`` with its default sequence parallelism: each rank half of each layer and every row).
The step time is the slowest rank's; tokens/s counts the whole batch.

``--repeats N`` runs every case N times, interleaved (FSDP, megatron, FSDP, ...), so
that a change in what else runs on the machine hits each backend alike.

Printed per case: parameters, real tokens per step (no padding), the median and the
fastest step time over all timed steps of all runs (on a shared machine the fastest
is the least disturbed; with ranks, each step's slowest rank), tokens/s (at the
median), the loss of the last timed step (float32: the two backends agree to
rounding, a check that they ran the same step), and peak memory, one figure a rank
(its largest over the runs):

- on the CPU, the process's resident-set high-water mark (``VmHWM``) during the timed
  steps, reset just before them (``/proc/self/clear_refs``, Linux), and how far it rose
  above the resident set at that reset (the step's own memory: activations and
  gradients, and with ``--warmup 0`` Adam's states, made at the first step); the
  resident set at the reset holds the libraries, the weights and the optimizer;
- on CUDA, ``torch.cuda.max_memory_allocated`` over the timed steps, and the model
  FLOPs utilisation as ``bench_trainer.py`` computes it (6 x parameters x tokens plus
  12 x layers x hidden x seq-len per token, against a measured bf16 matmul rate of the
  card; recomputation is not counted as useful work) over all ranks' cards.

On the CPU torch uses the machine's cores unless ``OMP_NUM_THREADS`` says otherwise:
``OMP_NUM_THREADS=1`` times what the loop's trainer does with one Ray CPU.

Limits: the CUDA path (``--device cuda``, with ``--world-size 2`` one card a rank) runs
the code the CPU path runs plus the synchronisations and counters named above; its
figures are recorded only where a GPU has run it (``bench/README.md``).

Current figures: ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_trainer import SIZES, build_model, measured_bf16_flops
from cores_check import cpu_description
from process_memory import reset_peak_rss, status_bytes

BACKENDS = ("fsdp", "megatron")

#: What each case prints, in this order (``None``: not measured on this device).
COLUMNS = (
    "backend",
    "recompute",
    "world_size",
    "step_time_s",
    "min_step_s",
    "tokens_per_s",
    "loss",
    "peak_memory_mib",
    "step_memory_mib",
    "mfu",
)


def case_config(spec: dict[str, Any]) -> Any:
    """The run config of one case: the backend, recomputation, precision and packing of ``spec``."""
    from telescope.testing.trainer import tiny_trainer_config

    bf16 = spec["precision"] == "bf16"
    overrides: dict[str, Any] = {
        "train_backend": spec["backend"],
        "seq_len": spec["seq_len"],
        "max_model_len": spec["seq_len"],
        "max_tokens": spec["max_completion"],
        "pad_to_multiple_of": 64,
        "model_dtype": "bfloat16" if bf16 and spec["device"] == "cuda" else "float32",
        "mixed_precision_dtype": "bfloat16" if bf16 else None,
        "gradient_checkpointing": spec["recompute"],
        "learning_rate": 1e-6,
        "entropy_chunk_size": spec["entropy_chunk_size"],
        "trainer_num_workers": spec["world_size"],
    }
    if spec["backend"] == "megatron":
        overrides["megatron_gradient_checkpointing"] = spec["recompute"]
        overrides["megatron_tensor_parallel_size"] = spec["world_size"]
    return tiny_trainer_config(spec["model"], **overrides)


def reset_peak_memory(device: str) -> float:
    """Restart the peak-memory count; returns what is held now, in MiB (resident set, or CUDA allocations)."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**20
    return reset_peak_rss() / 2**20


def peak_memory(device: str) -> float:
    """The peak since :func:`reset_peak_memory`, in MiB."""
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return status_bytes("VmHWM") / 2**20


def run_rank(rank: int, world_size: int, spec: dict[str, Any], out: str) -> None:
    """One rank of one case: set up, warm up, time the steps; writes ``rank<N>.json`` into ``out``."""
    import torch

    from telescope.plugins.facade import get_plugins
    from telescope.testing.trainer import synthetic_batch

    device = spec["device"]
    plugins = get_plugins()
    config = case_config(spec)
    backend = plugins.create_trainer_backend(config, plugins.create_algorithm(config))
    backend.setup(rank, world_size, device)
    times: list[float] = []
    tokens: list[int] = []
    held = 0.0
    metrics: dict[str, Any] = {}
    for step in range(spec["warmup"] + spec["steps"]):
        batch = synthetic_batch(
            num_groups=spec["groups"],
            group_size=spec["group_size"],
            vocab_size=min(spec["vocab"], 380),
            prompt_length=spec["prompt"],
            completion_lengths=(spec["min_completion"], spec["max_completion"]),
            step=step,
            seed=step,
        )
        if step == spec["warmup"]:
            held = reset_peak_memory(device)
        start = time.perf_counter()
        metrics = backend.train_step(batch)
        if device == "cuda":
            torch.cuda.synchronize()
        if step >= spec["warmup"]:
            times.append(time.perf_counter() - start)
            tokens.append(batch.num_tokens)
    peak = peak_memory(device)
    backend.close()
    result = {
        "rank": rank,
        "step_times_s": times,
        "tokens_per_step": sum(tokens) / len(tokens),
        "loss": float(metrics["loss"]),
        "held_memory_mib": held,
        "peak_memory_mib": peak,
        "torch_threads": torch.get_num_threads(),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


def run_case(spec: dict[str, Any]) -> dict[str, Any]:
    """One case in this process (``--world-size 1``) or on gloo ranks it starts; the ranks' results merged."""
    with tempfile.TemporaryDirectory(prefix="bench-backends-") as out:
        if spec["world_size"] == 1:
            run_rank(0, 1, spec, out)
        else:
            from telescope.testing.trainer import spawn_ranks

            spawn_ranks(run_rank, spec["world_size"], spec, out)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(spec["world_size"])]
    return {
        "backend": spec["backend"],
        "recompute": "on" if spec["recompute"] else "off",
        "world_size": spec["world_size"],
        "tokens_per_step": ranks[0]["tokens_per_step"],
        "step_times_s": [max(times) for times in zip(*(r["step_times_s"] for r in ranks), strict=True)],
        "loss": ranks[0]["loss"],
        "peak_memory_mib": [r["peak_memory_mib"] for r in ranks],
        "step_memory_mib": [r["peak_memory_mib"] - r["held_memory_mib"] for r in ranks],
        "torch_threads": ranks[0]["torch_threads"],
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One case over its ``--repeats`` runs: the median and fastest step of them all, each rank's largest peaks."""
    times = sorted(t for run in runs for t in run["step_times_s"])
    median = statistics.median(times)
    return {
        **runs[0],
        "runs": len(runs),
        "step_times_s": [run["step_times_s"] for run in runs],
        "step_time_s": median,
        "min_step_s": times[0],
        "tokens_per_s": runs[0]["tokens_per_step"] / median,
        "peak_memory_mib": [max(p) for p in zip(*(run["peak_memory_mib"] for run in runs), strict=True)],
        "step_memory_mib": [max(p) for p in zip(*(run["step_memory_mib"] for run in runs), strict=True)],
    }


def case_in_subprocess(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one case in a fresh interpreter (its own imports and peaks); its result, read from its last line."""
    done = subprocess.run(
        [sys.executable, __file__, "--case", json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{spec['backend']} (recompute {spec['recompute']}) failed with exit {done.returncode}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def parameter_count(model: Path) -> tuple[int, int, int]:
    """Parameters (tied weights once), hidden size and layers of the saved model, counted without its weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in meta.parameters()), int(config.hidden_size), int(config.num_hidden_layers)


def print_table(header: dict[str, Any], cases: list[dict[str, Any]]) -> None:
    for key, value in header.items():
        print(f"{key}: {format_value(value)}")
    shown = [c for c in COLUMNS if any(case.get(c) is not None for case in cases)]
    rows = [[format_value(case.get(c)) for c in shown] for case in cases]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(shown)]
    print("  ".join(c.ljust(w) for c, w in zip(shown, widths, strict=True)))
    for row in rows:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    for recompute in ("off", "on"):
        by_backend = {c["backend"]: c for c in cases if c["recompute"] == recompute}
        if len(by_backend) == 2:
            median, fastest = (by_backend["megatron"][k] / by_backend["fsdp"][k] for k in ("step_time_s", "min_step_s"))
            print(f"recompute {recompute}: a megatron step takes {median:.2f}x the FSDP one ({fastest:.2f}x fastest)")


def format_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):  # one value a rank
        return " / ".join(format_value(v) for v in value)
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="both", choices=[*BACKENDS, "both"])
    parser.add_argument("--recompute", default="both", choices=["off", "on", "both"])
    parser.add_argument("--world-size", type=int, default=1, choices=[1, 2])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--size", default="tiny", choices=list(SIZES))
    parser.add_argument("--seq-len", type=int, default=None, help="packed row length (512 on the CPU, 4096 on CUDA)")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--min-completion", type=int, default=16)
    parser.add_argument("--max-completion", type=int, default=200)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="runs of every case, interleaved")
    parser.add_argument("--entropy-chunk-size", type=int, default=1024)
    parser.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="auto: float32 on the CPU, bfloat16 weights and compute on CUDA",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: one case's spec, run in this process
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(json.loads(args.case))))
        return

    seq_len = args.seq_len or (4096 if args.device == "cuda" else 512)
    bf16 = args.precision == "bf16" or (args.precision == "auto" and args.device == "cuda")
    backends = list(BACKENDS) if args.backend == "both" else [args.backend]
    recomputes = [False, True] if args.recompute == "both" else [args.recompute == "on"]
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp), args.size)
        params, hidden, layers = parameter_count(model)
        from transformers import AutoConfig

        vocab = int(AutoConfig.from_pretrained(model).vocab_size)
        base = {
            "model": str(model),
            "vocab": vocab,
            "device": args.device,
            "precision": "bf16" if bf16 else "fp32",
            "world_size": args.world_size,
            "seq_len": seq_len,
            "groups": args.groups,
            "group_size": args.group_size,
            "prompt": args.prompt,
            "min_completion": args.min_completion,
            "max_completion": args.max_completion,
            "steps": args.steps,
            "warmup": args.warmup,
            "entropy_chunk_size": args.entropy_chunk_size,
        }
        order = [(backend, recompute) for recompute in recomputes for backend in backends]
        runs: dict[tuple[str, bool], list[dict[str, Any]]] = {case: [] for case in order}
        for _ in range(args.repeats):  # interleaved, so that a change in the machine's load hits every case
            for case in order:
                runs[case].append(case_in_subprocess({**base, "backend": case[0], "recompute": case[1]}))
        cases = [summarise(runs[case]) for case in order]
    header: dict[str, Any] = {
        "device": args.device,
        "size": args.size,
        "precision": base["precision"],
        "parameters": params,
        "seq_len": seq_len,
        "tokens_per_step": cases[0]["tokens_per_step"],
        "torch_threads": cases[0]["torch_threads"],
    }
    if args.device == "cpu":  # hosts differ in vector instructions (see cores_check.cpu_description)
        header["cpu"] = cpu_description()
        header["peak_memory"] = "resident set (VmHWM) during the timed steps; step_memory: its rise in them, MiB"
    else:
        peak = measured_bf16_flops(args.device)
        header["measured_bf16_tflops"] = round(peak / 1e12, 1)
        header["peak_memory"] = "torch.cuda.max_memory_allocated during the timed steps, MiB"
        flops_per_token = 6 * params + 12 * layers * hidden * seq_len
        for case in cases:
            case["mfu"] = flops_per_token * case["tokens_per_s"] / (peak * case["world_size"])
    if args.json:
        print(json.dumps({**header, "cases": cases}))
        return
    print_table(header, cases)


if __name__ == "__main__":
    main()
