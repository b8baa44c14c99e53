"""Trainer benchmark: train-step tokens per second, packing efficiency and (on CUDA) MFU.

Run by hand::

    .venv/bin/python bench/bench_trainer.py                          # tiny model, CPU
    .venv/bin/python bench/bench_trainer.py --device cuda --size 0.5b  # ~0.5B Qwen2 from a config, bf16
    .venv/bin/python bench/bench_trainer.py --size medium             # bench_vs_trl.py's larger model

The model is built locally from a config (random weights; nothing is downloaded).
Batches are synthetic: ``--groups`` x ``--group-size`` samples with a prompt of
``--prompt`` tokens and completions drawn uniformly from ``--min-completion`` to
``--max-completion``, so packing has real work to do. The first ``--warmup`` steps
are not timed. Printed: tokens/s (real tokens, no padding), packing efficiency
(real / padded tokens), step time, and on CUDA the model FLOPs utilisation against
a measured bf16 matmul rate of the card (6 x parameters x tokens for forward and
backward, plus 12 x layers x hidden x seq for attention; gradient checkpointing's
recomputation is not counted as useful work).

On the CPU torch uses all the machine's cores unless ``OMP_NUM_THREADS`` says
otherwise, where the loop gives its trainer one thread per Ray CPU (one in the quick
start): ``OMP_NUM_THREADS=1`` times what the loop's trainer does.

``--profile N`` runs one more step under ``torch.profiler`` and prints its top N ops
(by device time on CUDA), the device's busy time, kernel launches and synchronisations.

Current figures: ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from cores_check import cpu_description

SIZES = {
    # name: (hidden, intermediate, layers, heads, kv heads, vocab)
    "tiny": (64, 192, 2, 4, 2, None),
    "small": (128, 384, 4, 4, 2, None),
    "medium": (256, 768, 8, 8, 4, None),  # the tiny "medium" preset (bench_vs_trl.py's larger configuration)
    "0.5b": (896, 4864, 24, 14, 2, 151936),  # the Qwen2.5-0.5B shape
}


def build_model(folder: Path, size: str) -> Path:
    from telescope.models.tiny import PRESETS, TinyModelSpec, build_tiny_model

    if SIZES[size][5] is None:
        spec = PRESETS["test"] if size == "tiny" else PRESETS[size]
        return build_tiny_model(folder / size, spec)
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    hidden, inter, layers, heads, kv, vocab = SIZES[size]
    assert vocab is not None
    path = build_tiny_model(folder / "tok", TinyModelSpec())  # a tokenizer for the folder (ids < vocab)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        dtype="bfloat16",
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    out = folder / size
    model.save_pretrained(out)
    for f in path.iterdir():
        if "token" in f.name or f.name == "special_tokens_map.json":
            (out / f.name).write_bytes(f.read_bytes())
    return out


def measured_bf16_flops(device: str) -> float:
    import torch

    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    reps = 20
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - start)


def profile_one_step(backend: object, batch: object, device: str, top: int) -> None:
    """One more step under torch.profiler: the top ops by device (or CPU) time, and how busy the device was."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        backend.train_step(batch)  # type: ignore[attr-defined]
        if device == "cuda":
            torch.cuda.synchronize()
    wall = time.perf_counter() - start
    sort = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=top))
    if device == "cuda":
        from torch.autograd import DeviceType

        events = prof.key_averages()
        busy = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e6
        launches = sum(e.count for e in events if e.key.startswith("cudaLaunchKernel"))
        syncs = sum(e.count for e in events if "Synchronize" in e.key)
        print(f"profiled step {wall:.2f} s wall, device busy {busy:.2f} s, {launches} kernel launches, {syncs} syncs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--size", default="tiny", choices=list(SIZES))
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--min-completion", type=int, default=16)
    parser.add_argument("--max-completion", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument(
        "--entropy-chunk-size",
        type=int,
        default=1024,
        help="positions per entropy chunk (the config's default; the test config's 16 launches 64x the kernels)",
    )
    parser.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="bf16: bfloat16 weights and compute on CUDA, float32 weights with bfloat16 mixed precision on the "
        "CPU; auto: bf16 on CUDA, fp32 on the CPU",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the timed steps, profile one more step with torch.profiler and print its top N ops",
    )
    args = parser.parse_args()

    import torch

    from telescope.plugins.facade import get_plugins
    from telescope.testing.trainer import synthetic_batch, tiny_trainer_config

    seq_len = args.seq_len or (4096 if args.device == "cuda" else 512)
    bf16 = args.precision == "bf16" or (args.precision == "auto" and args.device == "cuda")
    with tempfile.TemporaryDirectory() as tmp:
        model_path = build_model(Path(tmp), args.size)
        config = tiny_trainer_config(
            model_path,
            seq_len=seq_len,
            max_model_len=seq_len,
            max_tokens=args.max_completion,
            pad_to_multiple_of=64,
            model_dtype="bfloat16" if bf16 and args.device == "cuda" else "float32",
            mixed_precision_dtype="bfloat16" if bf16 else None,
            gradient_checkpointing=args.gradient_checkpointing,
            learning_rate=1e-6,
            entropy_chunk_size=args.entropy_chunk_size,
        )
        backend = get_plugins().create_trainer_backend(config, get_plugins().create_algorithm(config))
        backend.setup(device=args.device)
        params = sum(p.numel() for p in backend.model.parameters())
        vocab = int(backend.model.config.vocab_size)
        hidden, layers = int(backend.model.config.hidden_size), int(backend.model.config.num_hidden_layers)
        rows = []
        for step in range(args.warmup + args.steps):
            batch = synthetic_batch(
                num_groups=args.groups,
                group_size=args.group_size,
                vocab_size=min(vocab, 380),
                prompt_length=args.prompt,
                completion_lengths=(args.min_completion, args.max_completion),
                step=step,
                seed=step,
            )
            metrics = backend.train_step(batch)
            if step >= args.warmup:
                rows.append((metrics, batch.num_tokens))
        if args.profile:
            profile_one_step(backend, batch, args.device, args.profile)
        backend.close()

    step_time = sum(m["timing_trainer_step_total"] for m, _ in rows) / len(rows)
    tokens = sum(n for _, n in rows) / len(rows)
    result = {
        "device": args.device,
        "size": args.size,
        "precision": "bf16" if bf16 else "fp32",
        "parameters": params,
        "seq_len": seq_len,
        "tokens_per_step": tokens,
        "step_time_s": step_time,
        "tokens_per_s": tokens / step_time,
        "packing_efficiency": sum(m["packing/efficiency"] for m, _ in rows) / len(rows),
        "microbatches_per_step": sum(m["packing/sequences"] for m, _ in rows) / len(rows),
        "torch_threads": torch.get_num_threads(),
    }
    if args.device == "cpu":  # hosts differ in vector instructions (see cores_check.cpu_description)
        result["cpu"] = cpu_description()
    if args.device == "cuda":
        peak = measured_bf16_flops(args.device)
        flops_per_token = 6 * params + 12 * layers * hidden * seq_len
        result["measured_bf16_tflops"] = peak / 1e12
        result["mfu"] = flops_per_token * result["tokens_per_s"] / peak
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    if args.json:
        print(json.dumps(result))
        return
    width = max(len(k) for k in result)
    for key, value in result.items():
        text = f"{value:,.4g}" if isinstance(value, float) else str(value)
        print(f"{key.ljust(width)}  {text}")


if __name__ == "__main__":
    main()
