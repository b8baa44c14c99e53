"""Adds ``telescope ui`` through the ``telescope_add_commands`` hook.

This module is imported by every ``telescope`` command, so it imports only click and
the hook marker; DuckDB, FastAPI and uvicorn load inside the command.
"""

from __future__ import annotations

import click

from telescope.plugins.hookspecs import hookimpl


@hookimpl
def telescope_add_commands(cli: click.Group) -> None:
    from telescope_ui_sync.cli import ui_command

    cli.add_command(ui_command)
