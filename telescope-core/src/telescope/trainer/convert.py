"""A trainer checkpoint to a Hugging Face model folder (what ``telescope convert-checkpoint`` runs).

:func:`convert_checkpoint` takes a checkpoint folder (``step_XXXXXXXX``) or a checkpoint
root (its ``latest`` is used); :mod:`telescope.cli.commands_convert` picks the folders of
a run. The output folder receives safetensors weights, ``config.json``,
``generation_config.json`` when present, and the tokenizer, written by
``save_pretrained`` so that ``AutoModelForCausalLM.from_pretrained(OUT)`` gives the
trained model (tied weights are re-tied; large models are sharded). The
conversion loads the weights into the architecture named by the checkpoint's
config and fails if any weight is missing or unknown, so a bad checkpoint is
reported, not silently converted. torch and transformers are imported only when
the command runs.
"""

from __future__ import annotations

from pathlib import Path

import click


def convert_checkpoint(checkpoint: Path, out: Path, dtype: str | None = None) -> Path:
    """Write ``checkpoint`` as a Hugging Face model folder at ``out``; returns ``out``."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from telescope.trainer.checkpoint import read_meta, resolve_checkpoint

    folder = resolve_checkpoint(checkpoint)
    meta = read_meta(folder)
    config = AutoConfig.from_pretrained(folder)
    torch_dtype = getattr(torch, dtype or meta.get("model_dtype", "float32"))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    weights = load_file(str(folder / "model.safetensors"))
    result = model.load_state_dict(weights, strict=False, assign=True)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = set(result.missing_keys) - tied
    if missing or result.unexpected_keys:
        raise click.ClickException(
            f"{folder}: the weights do not match {type(model).__name__}: missing {sorted(missing)[:5]}, "
            f"unknown {sorted(result.unexpected_keys)[:5]}"
        )
    model.tie_weights()
    model = model.to(torch_dtype)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    try:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(folder).save_pretrained(out)
    except (OSError, ValueError):
        click.echo(f"note: {folder} holds no tokenizer; copy one into {out}", err=True)
    return out
