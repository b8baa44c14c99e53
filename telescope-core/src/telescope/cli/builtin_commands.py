"""The built-in commands, added through ``telescope_add_commands`` like any plugin's."""

from __future__ import annotations

import click

from telescope.plugins.hookspecs import hookimpl


@hookimpl
def telescope_add_commands(cli: click.Group) -> None:
    from telescope.cli.commands_config import config_group
    from telescope.cli.commands_convert import convert_checkpoint_command
    from telescope.cli.commands_eval import eval_command
    from telescope.cli.commands_plugins import plugins_command
    from telescope.cli.commands_run import run_command
    from telescope.cli.commands_runs import runs_command
    from telescope.cli.commands_serve import serve_command

    for command in (
        run_command,
        runs_command,
        eval_command,
        serve_command,
        config_group,
        plugins_command,
        convert_checkpoint_command,
    ):
        cli.add_command(command)
