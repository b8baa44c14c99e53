"""``telescope run CONFIG [overrides]``: validate the config, then run the RL loop."""

from __future__ import annotations

from pathlib import Path

import click

from telescope.cli.commands_config import CONFIG_ARGS


@click.command(name="run", context_settings=CONFIG_ARGS)
@click.argument("config_file", required=False, type=click.Path(dir_okay=True, path_type=Path))
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def run_command(config_file: Path | None, overrides: tuple[str, ...]) -> None:
    """Train: validate CONFIG_FILE (+ --name value overrides), then run the loop."""
    from telescope.config.loader import load_config

    loaded = load_config(config_file, overrides)
    try:
        from telescope.runtime.launch import launch_run
    except ImportError as exc:
        raise click.ClickException(f"the config is valid, but the training loop could not be imported: {exc}") from None
    exit_code = launch_run(loaded)
    if exit_code:
        raise click.exceptions.Exit(exit_code)
