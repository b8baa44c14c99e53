"""Peak memory per rank of the megatron backend at set-up and at save, against the model's size.

What it measures: a Qwen2-shaped model (``--size``: ``1.5b`` is Qwen2.5-1.5B's shape,
1.54B parameters with a tied embedding; ``0.5b`` Qwen2.5-0.5B's) is written with random
bfloat16 weights as a sharded Hugging Face folder (``--shard-mb`` per file), tensor by
tensor, so building it costs no memory; nothing is downloaded. Then, for each layout
(``--layouts``: ``1`` = one rank, ``tp2``, ``pp2`` = two ranks), each rank (forked by
:func:`telescope.testing.trainer.spawn_ranks`, gloo, CPU) records its resident set
before set-up, its high-water mark (``VmHWM`` of ``/proc/self/status``, reset through
``/proc/self/clear_refs`` before each phase) during ``setup`` (model build, sharded
load) and during ``save_checkpoint`` (weights only: the sharded Hugging Face folder),
and, with ``--full-load-baseline``, what a full load would hold on top of that: the
whole ``from_pretrained`` model plus its megatron conversion on every rank (set-up), and
every weight gathered into one dict on one rank (save). ``model_dtype`` bfloat16,
float32 main parameters (the defaults), no recomputation.

Prints one line per rank: its parameters' bytes, the peaks as growth over its resident
set before the phase, and the ratio to the model's bfloat16 size. The formula the figures
check is in docs/megatron-backend.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from process_memory import reset_peak_rss, status_bytes

SIZES: dict[str, dict[str, Any]] = {
    "1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
}
LAYOUTS: dict[str, tuple[int, dict[str, int]]] = {
    "1": (1, {}),
    "tp2": (2, {"megatron_tensor_parallel_size": 2}),
    "pp2": (2, {"megatron_pipeline_parallel_size": 2}),
}
GIB = 2**30


def build_model(folder: Path, size: str, shard_mb: int) -> int:
    """A Qwen2-shaped model with random bfloat16 weights as a sharded HF folder; returns its parameter count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from telescope.models.tiny import PRESETS, build_tiny_model
    from telescope.trainer.safetensors_folder import StreamWriter, plan_shards, shard_file_name, write_index

    config = AutoConfig.for_model(
        "qwen2", tie_word_embeddings=True, max_position_embeddings=4096, torch_dtype="bfloat16", **SIZES[size]
    )
    with torch.device("meta"):
        shapes = {n: tuple(p.shape) for n, p in AutoModelForCausalLM.from_config(config).named_parameters()}
    entries = [(n, torch.bfloat16, s) for n, s in shapes.items()]
    shards = plan_shards(entries, shard_mb * 2**20)
    files = [shard_file_name(i, len(shards)) for i in range(len(shards))]
    folder.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    weight_map = {}
    for shard, file in zip(shards, files, strict=True):
        writer = StreamWriter(folder / file, shard)
        for name, dtype, shape in shard:
            if name.endswith("norm.weight"):
                tensor = torch.ones(shape, dtype=dtype)
            else:
                tensor = torch.empty(shape, dtype=dtype).normal_(0.0, 0.02, generator=generator)
            writer.write(name, tensor)
            weight_map[name] = file
        writer.close()
    write_index(folder, weight_map, sum(2 * _numel(s) for s in shapes.values()))
    config.save_pretrained(folder)
    tokenizer = folder.parent / "tokenizer-source"
    build_tiny_model(tokenizer, PRESETS["test"])  # a tokenizer to copy (the checkpoint saves one)
    for path in tokenizer.iterdir():
        if "token" in path.name or path.name == "chat_template.jinja":
            (folder / path.name).write_bytes(path.read_bytes())
    return sum(_numel(s) for s in shapes.values())


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count


def _rank(rank: int, world_size: int, model: str, out: str, settings: dict[str, int], full_load_baseline: bool) -> None:
    import gc

    import torch

    from telescope.plugins.facade import get_plugins
    from telescope.testing.trainer import tiny_trainer_config

    overrides = {
        "train_backend": "megatron",
        "model_dtype": "bfloat16",
        "trainer_num_workers": world_size,
        "megatron_gradient_checkpointing": False,
        **settings,
    }
    config = tiny_trainer_config(model, **overrides)
    plugins = get_plugins()
    backend: Any = plugins.create_trainer_backend(config, plugins.create_algorithm(config))
    figures: dict[str, Any] = {"rank": rank}
    start = time.perf_counter()
    before = reset_peak_rss()
    backend.setup(rank, world_size, "cpu")
    figures["setup_s"] = time.perf_counter() - start
    figures["rss_before_setup"] = before
    figures["setup_peak"] = status_bytes("VmHWM") - before
    figures["after_setup"] = status_bytes("VmRSS") - before
    figures["own_bytes"] = sum(p.numel() * p.element_size() for p in backend.main.params.values())
    figures["own_bytes"] += sum(p.numel() * p.element_size() for p in backend.model.parameters())
    figures["own_params"] = sum(p.numel() for p in backend.main.params.values())
    gc.collect()
    before = reset_peak_rss()
    start = time.perf_counter()
    backend.save_checkpoint(Path(out) / "ckpt", training_state=False)
    figures["save_s"] = time.perf_counter() - start
    figures["save_peak"] = status_bytes("VmHWM") - before
    if full_load_baseline:
        from telescope_megatron.convert import hf_to_megatron
        from transformers import AutoModelForCausalLM

        gc.collect()
        before = reset_peak_rss()
        hf = dict(AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).state_dict())
        full = hf_to_megatron(hf, backend.shape)
        figures["full_load_setup_extra"] = status_bytes("VmHWM") - before
        del hf, full
        gc.collect()
        before = reset_peak_rss()
        weights = {n: t.to("cpu", copy=True) for n, t in backend.named_weights()}
        figures["full_load_save_extra"] = status_bytes("VmHWM") - before if rank == 0 else 0
        del weights
    backend.close()
    Path(out, f"rank_{rank}.json").write_text(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=list(SIZES), default="1.5b")
    parser.add_argument("--layouts", default="1,tp2,pp2")
    parser.add_argument("--shard-mb", type=int, default=1024)
    parser.add_argument("--full-load-baseline", action="store_true", help="also measure what the previous code held")
    args = parser.parse_args()

    from telescope.testing.trainer import spawn_ranks

    with tempfile.TemporaryDirectory(prefix="bench-megatron-memory-") as tmp:
        model = Path(tmp) / "model"
        params = build_model(model, args.size, args.shard_mb)
        size = 2 * params
        print(
            f"model: Qwen2-shaped {args.size}, {params / 1e9:.3f}B parameters, {size / GIB:.2f} GiB in bfloat16, "
            f"{len(list(model.glob('*.safetensors')))} files"
        )
        for layout in args.layouts.split(","):
            world_size, settings = LAYOUTS[layout]
            out = Path(tmp) / layout
            out.mkdir()
            spawn_ranks(_rank, world_size, str(model), str(out), settings, args.full_load_baseline)
            for rank in range(world_size):
                f = json.loads((out / f"rank_{rank}.json").read_text())
                line = (
                    f"{layout} rank {rank}: own {f['own_params'] / 1e9:.3f}B params ({f['own_bytes'] / GIB:.2f} GiB "
                    f"model + main); set-up peak +{f['setup_peak'] / GIB:.2f} GiB ({f['setup_peak'] / size:.2f}x "
                    f"the bf16 model; {f['setup_s']:.0f} s), save peak +{f['save_peak'] / GIB:.2f} GiB "
                    f"({f['save_peak'] / size:.2f}x; {f['save_s']:.0f} s); RSS before set-up "
                    f"{f['rss_before_setup'] / GIB:.2f} GiB"
                )
                if args.full_load_baseline:
                    line += (
                        f"; a full load's set-up +{f['full_load_setup_extra'] / GIB:.2f} GiB on top, "
                        f"a full save's gathered dict +{f['full_load_save_extra'] / GIB:.2f} GiB"
                    )
                print(line, flush=True)
            files = sorted(p.name for p in (out / "ckpt").glob("*.safetensors"))
            print(f"{layout}: checkpoint files {files}", flush=True)


if __name__ == "__main__":
    main()
