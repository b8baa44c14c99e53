"""``telescope convert-checkpoint CHECKPOINT OUT``: trainer checkpoints to Hugging Face model folders.

CHECKPOINT is one checkpoint folder (``step_XXXXXXXX``), converted into OUT; or a
checkpoint root (``checkpoints/``) or a run directory (its config's ``checkpoint_dir``,
else its ``checkpoints/``), whose every complete checkpoint, or those ``--steps`` selects
(``2,4``, ranges ``10-50``, ``latest``), is converted into ``OUT/step_XXXXXXXX`` by
:func:`telescope.trainer.convert.convert_checkpoint`. A step asked for without a complete
checkpoint stops the command before anything is converted, naming the steps there are.
torch and transformers are imported only when the command runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from telescope.cli.main import UserError


def checkpoint_root_of(path: Path) -> Path:
    """A run directory's checkpoint root (its config's ``checkpoint_dir``, else ``checkpoints/``), else ``path``."""
    config_file = path / "config.json"
    if config_file.is_file():
        try:
            configured = json.loads(config_file.read_text(encoding="utf-8")).get("checkpoint_dir")
        except (OSError, ValueError, AttributeError):
            configured = None
        if configured:
            return Path(configured)
    return path / "checkpoints" if (path / "checkpoints").is_dir() else path


def select_steps(spec: str | None, available: list[int]) -> list[int]:
    """The steps ``spec`` names (``None``: all ``available``, oldest first).

    ``spec`` is a comma list of steps, inclusive ranges ``A-B`` (the checkpoints inside)
    and ``latest``. A step without a checkpoint, or a range with none, is a :class:`UserError`.
    """
    if spec is None:
        return available
    wanted: set[int] = set()
    empty_ranges: list[str] = []
    for part in (piece.strip() for piece in spec.split(",")):
        try:
            if part == "latest":
                wanted.add(available[-1])
            elif "-" in part:
                first, last = (int(bound) for bound in part.split("-", 1))
                inside = {step for step in available if first <= step <= last}
                if first > last or not inside:
                    empty_ranges.append(part)
                wanted |= inside
            else:
                wanted.add(int(part))
        except ValueError:
            raise UserError(f"--steps {spec!r}: {part!r} is not a step, a range A-B or 'latest'") from None
    missing = [str(step) for step in sorted(wanted - set(available))] + empty_ranges
    if missing:
        raise UserError(
            f"--steps {spec!r}: no checkpoint for {', '.join(missing)}; "
            f"the checkpoints are steps {', '.join(map(str, available))}"
        )
    return sorted(wanted)


@click.command(name="convert-checkpoint")
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--steps",
    default=None,
    help="From a run or a checkpoint root: the steps to convert, e.g. 2,4 or 10-50 or latest (default: every step).",
)
@click.option(
    "--dtype",
    type=click.Choice(["float32", "float16", "bfloat16"]),
    default=None,
    help="Weight dtype of the output (default: the run's model_dtype).",
)
@click.option(
    "--max-shard-gb",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="Largest output safetensors file, in GiB (a larger single tensor gets a file of its own).",
)
def convert_checkpoint_command(
    checkpoint: Path, out: Path, steps: str | None, dtype: str | None, max_shard_gb: float
) -> None:
    """Convert a checkpoint, or a run's checkpoints (each to OUT/step_XXXXXXXX), to Hugging Face folders."""
    import functools

    from telescope.trainer.checkpoint import META, list_checkpoints
    from telescope.trainer.convert import convert_checkpoint as convert

    convert_checkpoint = functools.partial(convert, max_shard_bytes=int(max_shard_gb * 2**30))

    if (checkpoint / META).exists():
        if steps is not None:
            raise UserError(f"{checkpoint} is one checkpoint; --steps selects among a run's or a checkpoint root's")
        click.echo(f"wrote {convert_checkpoint(checkpoint, out, dtype)}")
        return
    root = checkpoint_root_of(checkpoint)
    found = dict(list_checkpoints(root))
    if not found:
        raise UserError(
            f"no checkpoint in {root}: give a step_XXXXXXXX folder, a checkpoint root, or a run directory "
            "whose run saved checkpoints (checkpoint_every > 0)"
        )
    for step in select_steps(steps, sorted(found)):
        click.echo(f"wrote {convert_checkpoint(found[step], out / found[step].name, dtype)}")
