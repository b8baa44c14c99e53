"""``telescope eval CONFIG CHECKPOINT``: the config's evals on a saved checkpoint."""

from __future__ import annotations

from pathlib import Path

import click

from telescope.cli.commands_config import CONFIG_ARGS


@click.command(name="eval", context_settings=CONFIG_ARGS)
@click.argument("config_file", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--output", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to write evals.jsonl (default: CHECKPOINT/../evals-<name>).")  # fmt: skip
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def eval_command(config_file: Path, checkpoint: Path, output: Path | None, overrides: tuple[str, ...]) -> None:
    """Run CONFIG_FILE's evals on CHECKPOINT (a checkpoint folder, a run directory or a model folder)."""
    from telescope.config.loader import load_config
    from telescope.loop.standalone_eval import run_evals

    loaded = load_config(config_file, overrides)
    if not checkpoint.exists():
        raise click.ClickException(f"no such checkpoint: {checkpoint}")
    target = output or checkpoint.resolve().parent / f"evals-{checkpoint.resolve().name}"
    try:
        results = run_evals(loaded.config, checkpoint, target)
    except (FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    for name, metrics in results.items():
        click.echo(f"{name}:")
        for key, value in metrics.items():
            click.echo(f"  {key.split('/', 2)[-1]:<24} {value:.4f}")
    click.echo(f"results written to {target / 'evals.jsonl'}")
