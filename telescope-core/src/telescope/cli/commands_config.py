"""``telescope config show|validate|defaults``."""

from __future__ import annotations

from pathlib import Path

import click

CONFIG_ARGS = {"ignore_unknown_options": True, "allow_extra_args": True, "allow_interspersed_args": False}


@click.group(name="config")
def config_group() -> None:
    """Inspect and validate run configs."""


@config_group.command(name="show", context_settings=CONFIG_ARGS)
@click.argument("config_file", required=False, type=click.Path(dir_okay=True, path_type=Path))
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def show_command(config_file: Path | None, overrides: tuple[str, ...]) -> None:
    """Print the resolved config and which layer set each value.

    CONFIG_FILE is a YAML run config; OVERRIDES are --name value pairs.
    """
    from telescope.config.loader import load_config
    from telescope.config.render import render_resolved

    loaded = load_config(config_file, overrides)
    click.echo(render_resolved(loaded.config, loaded.provenance))


@config_group.command(name="validate", context_settings=CONFIG_ARGS)
@click.option(
    "--defaults",
    "layer",
    is_flag=True,
    help="Check the file as a defaults layer (such as default_train.yaml): no environment needed.",
)
@click.option(
    "--eval",
    "eval_form",
    is_flag=True,
    help="Check the file as a telescope eval config (evals and checkpoint_dir or checkpoints; no environment).",
)
@click.argument("config_file", required=False, type=click.Path(dir_okay=True, path_type=Path))
@click.argument("overrides", nargs=-1, type=click.UNPROCESSED)
def validate_command(layer: bool, eval_form: bool, config_file: Path | None, overrides: tuple[str, ...]) -> None:
    """Check a config (schema, cross-field rules, plugin names); exit 2 if invalid."""
    from telescope.config.loader import load_config

    loaded = load_config(config_file, overrides, layer=layer, purpose="eval" if eval_form else "run")
    origins = loaded.provenance.values()
    from_cli = sum(1 for o in origins if o == "cli")
    from_file = sum(1 for o in origins if o not in ("cli", "default") and not o.startswith("derived"))
    what = ("valid as a defaults layer" if layer else "valid") + (" for telescope eval" if eval_form else "")
    click.echo(
        f"ok: {config_file or 'command line'} is {what} "
        f"({from_file} values from the file, {from_cli} from the command line, the rest defaults)"
    )


@config_group.command(name="defaults")
@click.option("--write", "write_path", type=click.Path(dir_okay=False, path_type=Path), help="Write to this file.")
def defaults_command(write_path: Path | None) -> None:
    """Print every parameter with its default (the text of configs/defaults/default_train.yaml)."""
    from telescope.config.render import render_defaults

    text = render_defaults()
    if write_path is None:
        click.echo(text, nl=False)
    else:
        write_path.parent.mkdir(parents=True, exist_ok=True)
        write_path.write_text(text, encoding="utf-8")
        click.echo(f"wrote {write_path}")
