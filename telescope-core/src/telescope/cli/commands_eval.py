"""``telescope eval CONFIG [CHECKPOINT]``: the config's evals on saved checkpoints.

Two forms: ``telescope eval CONFIG CHECKPOINT`` scores one checkpoint (a checkpoint
folder, a run directory or checkpoints root (its latest), or a Hugging Face folder);
``telescope eval CONFIG`` scores the checkpoints the config names, the upstream's eval
form (``checkpoint_dir``, ``checkpoints``, ``hf_weights``, ``wandb_run_path``; see
:mod:`telescope.config.eval_form` and :mod:`telescope.runtime.eval_checkpoints`).
"""

from __future__ import annotations

from pathlib import Path

import click

# Unlike run/config, eval has an option of its own (--output), accepted anywhere on the line;
# every other --name value pair is a config override.
EVAL_ARGS = {"ignore_unknown_options": True, "allow_extra_args": True}


def default_output(config_file: Path, checkpoint: Path | None, checkpoint_dir: str | None) -> Path:
    """``evals-<name>`` beside the checkpoint argument or ``checkpoint_dir``, else ``evals-<config name>`` here."""
    source = checkpoint if checkpoint is not None else Path(checkpoint_dir) if checkpoint_dir else None
    if source is None:
        return Path(f"evals-{config_file.stem}")
    source = source.resolve()
    return source.parent / f"evals-{source.name}"


@click.command(name="eval", context_settings=EVAL_ARGS)
@click.argument("config_file", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("checkpoint", required=False, type=click.Path(path_type=Path))
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to write evals.jsonl (default: evals-<name> beside CHECKPOINT/checkpoint_dir).",
)
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def eval_command(config_file: Path, checkpoint: Path | None, output: Path | None, overrides: tuple[str, ...]) -> None:
    """Run CONFIG_FILE's evals on CHECKPOINT, or on the checkpoints the config names.

    CHECKPOINT is a checkpoint folder, a run directory or a model folder. Without it, the
    config's checkpoint_dir (its step_N folders) and/or checkpoints ([{path, step}]) are
    evaluated in step order.
    """
    from telescope.cli.main import UserError
    from telescope.config.loader import load_config, locate
    from telescope.runtime.eval_checkpoints import CheckpointSourceError, resolve
    from telescope.runtime.eval_wandb import EvalWandbError
    from telescope.runtime.standalone_eval import run_evals

    if checkpoint is not None and checkpoint.name.startswith("--"):  # an override, not a checkpoint
        overrides, checkpoint = (str(checkpoint), *overrides), None
    loaded = load_config(config_file, overrides, purpose="eval", checkpoint_argument=checkpoint is not None)
    config = loaded.config
    notes: list[str] = []
    try:
        checkpoints = resolve(config, checkpoint, notes)
    except CheckpointSourceError as exc:
        raise UserError(locate(str(exc), loaded.provenance)) from None  # + the file:line of the fields it names
    for note in notes:
        click.echo(f"note: {note}", err=True)
    target = output or default_output(config_file, checkpoint, config.checkpoint_dir)
    steps = ", ".join(str(c.step) for c in checkpoints)
    click.echo(f"evaluating {len(checkpoints)} checkpoint(s), step {steps}", err=True)

    def show(step: int, results: dict[str, dict[str, float]]) -> None:
        click.echo(f"step {step}:")
        for name, metrics in results.items():
            click.echo(f"  {name}:")
            for key, value in metrics.items():
                click.echo(f"    {key.split('/', 2)[-1]:<24} {value:.4f}")

    try:
        run_evals(config, checkpoints, target, on_result=show)
    except (FileNotFoundError, ValueError, EvalWandbError) as exc:
        raise UserError(str(exc)) from None
    click.echo(f"results written to {target / 'evals.jsonl'}")
