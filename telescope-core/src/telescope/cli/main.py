"""The ``telescope`` entry point: builds the command group and turns errors into exit codes.

Every command, the built-in ones included, is added through the
``telescope_add_commands`` hook. User errors (bad config, unknown plugin name,
duplicate plugin) print one ``error:`` message and exit with code 2, never a
traceback; ``--debug`` on ``telescope`` (or TELESCOPE_DEBUG=1) shows tracebacks.
Only light modules are imported here: ``--help``, ``plugins`` and ``config`` never
import torch or ray.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import click

from telescope import __version__

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UserError(click.ClickException):
    """An error the user can fix; printed as ``error: message``, exit code 2."""

    exit_code = EXIT_USAGE

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def _show_warning(
    message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None
) -> None:
    from telescope.plugins.manager import PluginImportWarning

    if issubclass(category, PluginImportWarning):
        click.echo(f"warning: {message}", err=True)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@click.group(name="telescope", context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="telescope")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Telescope: asynchronous RL post-training for LLMs.

    Start with `telescope run CONFIG`; `telescope config show CONFIG` prints the
    resolved configuration and `telescope plugins` lists what is installed.
    """
    if debug:
        os.environ["TELESCOPE_DEBUG"] = "1"


def build_cli() -> click.Group:
    """The command group with every plugin's commands added."""
    from telescope.plugins.facade import get_plugins

    get_plugins().add_commands(cli)
    return cli


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns (and, as a console script, exits with) the exit code."""
    from telescope.config.errors import ConfigError
    from telescope.plugins.registry import PluginError

    warnings.showwarning = _show_warning
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args[:1] or bool(os.environ.get("TELESCOPE_DEBUG"))
    try:
        group = build_cli()
        # without standalone mode, click returns the code of a command's Exit instead of exiting
        result = group.main(args=args, prog_name="telescope", standalone_mode=False)
        if isinstance(result, int) and result:
            return result
    except (ConfigError, PluginError) as exc:
        if debug:
            raise
        click.echo(f"error: {exc}", err=True)
        return EXIT_USAGE
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return EXIT_INTERRUPTED
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    return EXIT_OK


def entry_point() -> None:
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    entry_point()
