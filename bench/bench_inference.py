"""Benchmark the embedded engine and the weight transports (run by hand; prints tables).

    .venv/bin/python bench/bench_inference.py                 # CPU, the "small" tiny model
    .venv/bin/python bench/bench_inference.py --device cuda   # GPU, a ~0.5B Qwen2 built from a config

Generation: generated tokens per second at batch 1, 8 and 64 (``--batches``),
each request sampling ``--new-tokens`` tokens (EOS ignored) from a
``--prompt-len``-token prompt, against plain ``model.generate`` on the same
model with the same batch (left-padded, sampling, ``min_new_tokens`` =
``max_new_tokens``). The engine figure includes its scheduling, per-row
sampling and log-probabilities; ``generate`` computes neither per-row seeds nor
log-probabilities.

Weight sync: seconds per GB for the memory transport (send, and receive and
load into a same-shaped state, overlapped as in a run) against a plain ``copy_``
of the same bytes, by :func:`bench_weight_sync.bench_sync` (also runnable alone,
with more options; the transport copies twice, and overlapping the two copies is
what brings it under 2x the bound). ``--sync-mb`` sets the state size.

``--repeats N`` runs each batch N times, engine and generate alternating, and
prints medians; ``--forward hf`` measures the engine with Hugging Face's forward
instead of the compact one (:mod:`telescope.inference.embedded.compact`);
``--cpu-compile on,off`` also measures the engine with its decode step through
``torch.compile`` (the engine does not compile: this says what it would give,
after an untimed batch of the same size; the first compile takes tens of seconds);
``--sync-mb 0`` skips the weight sync.

The GPU path (``--device cuda``) uses random weights with Qwen2.5-0.5B's shapes
(hidden 896, 24 layers, 14 heads / 2 KV heads, MLP 4864, vocabulary 151936) and
prompt token ids only, and measures the engine twice, with its decode step replayed
as CUDA graphs and eagerly (``--cuda-graphs on,off``); on CUDA each engine figure is
the second of two batches of the same size (the first captures the graphs), and
``generate`` is warmed up with a 4-token call.

Current figures: ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from bench_weight_sync import bench_sync
from cores_check import cpu_description


def build_model(kind: str, root: Path) -> Path:
    from telescope.models.tiny import PRESETS, build_tiny_model, build_tokenizer

    if kind in PRESETS:
        return build_tiny_model(root / kind, PRESETS[kind])
    from transformers import AutoModelForCausalLM, Qwen2Config

    path = root / "qwen2-0.5b-shape"
    config = Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=2,
        pad_token_id=0,
        dtype="bfloat16",
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    build_tokenizer(PRESETS["test"]).save_pretrained(path)
    return path


def bench_engine(
    path: Path,
    device: str,
    dtype: str,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    forward: str = "auto",
    cuda_graphs: bool = True,
    compiled: bool = False,
) -> float:
    """Generated tokens/s of one batch; on CUDA, or ``compiled``, after an untimed batch of the same size.

    ``compiled``: the compact runner's decode step through ``torch.compile`` (a
    measurement of what compilation would give; the engine itself does not compile).
    """
    from telescope.inference.embedded.engine import Engine, EngineSettings, GenerationParams

    engine = Engine(
        EngineSettings(
            model_path=str(path),
            device=device,
            dtype=dtype,
            max_num_seqs=max(64, batch),
            max_model_len=prompt_len + new_tokens + 8,
            forward=forward,  # type: ignore[arg-type]
            cuda_graphs=cuda_graphs,
        )
    ).start()
    try:
        if compiled:
            decoder = getattr(engine.runner, "decoder", None)  # the compact runner's
            if decoder is None:
                raise SystemExit(f"--cpu-compile on needs the compact forward; the engine runs {engine.runner.name}")
            decoder.decode_step = torch.compile(decoder.decode_step)
        vocab = min(engine.model.config.vocab_size, 300)
        params = GenerationParams(max_tokens=new_tokens, ignore_eos=True, detokenize=False)
        engine.generate([5] * prompt_len, GenerationParams(max_tokens=4, ignore_eos=True, detokenize=False))

        def run(tag: str) -> float:
            done = threading.Semaphore(0)
            start = time.perf_counter()
            for i in range(batch):
                prompt = [(7 * i + j) % vocab + 3 for j in range(prompt_len)]
                engine.submit(f"{tag}{i}", prompt, params, lambda r: done.release())
            for _ in range(batch):
                done.acquire()
            return time.perf_counter() - start

        if device.startswith("cuda") or compiled:
            run("warm")
        elapsed = run("b")
    finally:
        engine.stop()
    return batch * new_tokens / elapsed


def bench_generate(path: Path, device: str, dtype: str, batch: int, prompt_len: int, new_tokens: int) -> float:
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    model: Any = loaded.to(device).eval()  # type: ignore[arg-type]
    vocab = min(model.config.vocab_size, 300)
    ids = torch.tensor([[(7 * i + j) % vocab + 3 for j in range(prompt_len)] for i in range(batch)], device=device)
    mask = torch.ones_like(ids)
    kwargs = {
        "do_sample": True,
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "pad_token_id": 0,
        "top_k": 0,
    }
    with torch.inference_mode():
        model.generate(
            input_ids=ids[:, :8], attention_mask=mask[:, :8], **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4}
        )
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=mask, **kwargs)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    return batch * new_tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default=None, help="tiny preset (test, small) or 'qwen0.5b' (default by device)")
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--sync-mb", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=1, help="runs per batch, engine and generate alternating")
    parser.add_argument("--forward", default="auto", help="the engine's forward: auto, compact or hf")
    parser.add_argument(
        "--cuda-graphs", default="on,off", help="on CUDA, engine runs with decode graphs on, off or both (on,off)"
    )
    parser.add_argument(
        "--cpu-compile",
        default="off",
        help="on the CPU, engine runs with the decode step eager (off), through torch.compile (on), or both (on,off)",
    )
    args = parser.parse_args()
    kind = args.model or ("small" if args.device == "cpu" else "qwen0.5b")
    dtype = "float32" if args.device == "cpu" else "bfloat16"
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(kind, Path(tmp))
        params = sum(
            p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(str(path)).parameters()
        )
        print(
            f"model {kind} ({params / 1e6:.2f}M parameters), device {args.device}, {dtype}, "
            f"prompt {args.prompt_len} tokens, {args.new_tokens} new tokens per request, "
            f"torch threads {torch.get_num_threads()}"
        )
        if args.device == "cpu":  # hosts differ in vector instructions, and so in speed
            print(cpu_description())
        print(f"engine forward {args.forward}; medians of {args.repeats} run(s), engine and generate alternating")
        on_cuda = args.device.startswith("cuda")
        modes = [m == "on" for m in (args.cuda_graphs if on_cuda else args.cpu_compile).split(",")]
        label = {True: "graphs" if on_cuda else "compiled", False: "eager"}
        print(f"{'batch':>5} | {'engine':>8} | {'engine tok/s':>12} | {'generate tok/s':>14} | ratio | per-run ratios")
        for batch in (int(b) for b in args.batches.split(",")):
            ours_runs: dict[bool, list[float]] = {m: [] for m in modes}
            base_runs: list[float] = []
            for _ in range(args.repeats):
                for mode in modes:
                    ours_runs[mode].append(
                        bench_engine(
                            path,
                            args.device,
                            dtype,
                            batch,
                            args.prompt_len,
                            args.new_tokens,
                            args.forward,
                            cuda_graphs=mode,
                            compiled=mode and not on_cuda,
                        )
                    )
                base_runs.append(bench_generate(path, args.device, dtype, batch, args.prompt_len, args.new_tokens))
            base = statistics.median(base_runs)
            for mode in modes:
                ours = statistics.median(ours_runs[mode])
                ratios = " ".join(f"{o / b:.2f}" for o, b in zip(ours_runs[mode], base_runs, strict=True))
                print(
                    f"{batch:>5} | {label[mode]:>8} | {ours:>12.0f} | {base:>14.0f} | {ours / base:5.2f} | {ratios}",
                    flush=True,
                )
    if args.sync_mb <= 0:  # --sync-mb 0: generation only
        return
    sync = bench_sync(args.sync_mb)
    print(f"\nweight sync, {args.sync_mb} MB float32 state, one machine (bench/bench_weight_sync.py):")
    print(f"  memory transport (send and receive/load overlapped, steady state): {sync['overlapped']:.3f} s/GB")
    ratios = f"transport / bound = {sync['ratio_overlapped']:.2f}; end to end {sync['ratio_end_to_end']:.2f}"
    print(f"  plain copy_ bound (one copy):  {sync['bound']:.3f} s/GB  ({ratios})")


if __name__ == "__main__":
    main()
