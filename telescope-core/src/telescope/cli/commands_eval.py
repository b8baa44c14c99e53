"""``telescope eval CONFIG CHECKPOINT``: the config's evals on a saved checkpoint."""

from __future__ import annotations

from pathlib import Path

import click

# Unlike run/config, eval has an option of its own (--output), accepted anywhere on the line;
# every other --name value pair is a config override.
EVAL_ARGS = {"ignore_unknown_options": True, "allow_extra_args": True}


@click.command(name="eval", context_settings=EVAL_ARGS)
@click.argument("config_file", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to write evals.jsonl (default: CHECKPOINT/../evals-<name>).")  # fmt: skip
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def eval_command(config_file: Path, checkpoint: Path, output: Path | None, overrides: tuple[str, ...]) -> None:
    """Run CONFIG_FILE's evals on CHECKPOINT (a checkpoint folder, a run directory or a model folder)."""
    from telescope.cli.main import UserError
    from telescope.config.loader import load_config
    from telescope.runtime.standalone_eval import run_evals

    loaded = load_config(config_file, overrides)
    if not checkpoint.exists():
        raise UserError(f"no such checkpoint: {checkpoint}")
    target = output or checkpoint.resolve().parent / f"evals-{checkpoint.resolve().name}"
    try:
        results = run_evals(loaded.config, checkpoint, target)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    for name, metrics in results.items():
        click.echo(f"{name}:")
        for key, value in metrics.items():
            click.echo(f"  {key.split('/', 2)[-1]:<24} {value:.4f}")
    click.echo(f"results written to {target / 'evals.jsonl'}")
