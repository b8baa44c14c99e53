"""``telescope ui [RUN_DIR_OR_FOLDER ...] [--port 8005] [--host 127.0.0.1]``.

Each argument is a run directory or a folder whose sub-directories are runs (new ones
are picked up while the server runs); with none, ``./runs``. The synced data lives in one
DuckDB file (``--db``, default ``~/.telescope/ui-sync.duckdb`` or
``$TELESCOPE_UI_DB``); a second ``telescope ui`` on the same file is refused by DuckDB's
file lock, so give it its own ``--db``.

The server binds 127.0.0.1 unless ``--host`` says otherwise; any other address is served
with a warning, since the API has no authentication and shows model outputs, configs and
logs to whoever can reach it. Requests that name another host than the bound address or a
loopback name are refused (against DNS rebinding); ``--allow-host NAME`` (repeatable) adds a
name the dashboard is reached by (a reverse proxy's, a tunnel's).

W&B runs (see :mod:`telescope_ui_sync.sync.wandb_source`) come in when wandb is installed:
W&B run folders under PATHS (offline runs, no key needed), and with ``--wandb-project
ENTITY/PROJECT`` (repeatable) the project's runs tagged ``telescope``, through W&B's API
when a key is configured.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

DEFAULT_PORT = 8005
DEFAULT_HOST = "127.0.0.1"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def default_db_path() -> Path:
    """``$TELESCOPE_UI_DB``, else ``~/.telescope/ui-sync.duckdb``."""
    env = os.environ.get("TELESCOPE_UI_DB")
    return Path(env).expanduser() if env else Path.home() / ".telescope" / "ui-sync.duckdb"


@click.command("ui")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--port",
    default=DEFAULT_PORT,
    show_default=True,
    help="Port to serve on (0: any free port, named in the URL printed).",
)
@click.option(
    "--host",
    default=DEFAULT_HOST,
    show_default=True,
    help="Address to bind. Anything but loopback exposes runs to the network (no authentication).",
)
@click.option("--db", "db_path", type=click.Path(path_type=Path), default=None, help="DuckDB file of the synced data.")
@click.option("--poll-interval", default=0.5, show_default=True, help="Seconds between two looks at the run folders.")
@click.option("--open-browser/--no-browser", default=False, show_default=True, help="Open the dashboard in a browser.")
@click.option(
    "--wandb-project",
    "wandb_projects",
    multiple=True,
    metavar="ENTITY/PROJECT",
    help="Also show this W&B project's runs tagged 'telescope' (needs wandb and a W&B key). Repeatable.",
)
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    metavar="NAME",
    help="Also answer requests for this host name (besides the bound address and loopback). Repeatable.",
)
def ui_command(
    paths: tuple[Path, ...],
    port: int,
    host: str,
    db_path: Path | None,
    poll_interval: float,
    open_browser: bool,
    wandb_projects: tuple[str, ...],
    allow_hosts: tuple[str, ...],
) -> None:
    """Serve the dashboard of the runs under PATHS (run directories or folders of runs; default ./runs)."""
    from telescope_ui_sync.server.serve import serve

    roots = [p.expanduser().resolve() for p in paths] or [Path("runs").resolve()]
    for root in roots:
        if not root.exists():
            click.echo(f"telescope ui: {root} does not exist yet; it is picked up when it appears", err=True)
    if host not in LOOPBACK_HOSTS:
        click.echo(
            f"telescope ui: WARNING: binding {host}: anyone who can reach this address sees these runs' "
            "configs, rollouts and logs (there is no authentication). Use --host 127.0.0.1 to keep it local.",
            err=True,
        )
    db = (db_path or default_db_path()).expanduser()
    wandb_api = _wandb_api() if wandb_projects else None
    serve(
        roots,
        db_path=db,
        host=host,
        port=port,
        poll_interval=poll_interval,
        open_browser=open_browser,
        wandb_api=wandb_api,
        wandb_projects=wandb_projects if wandb_api is not None else (),
        allow_hosts=allow_hosts,
    )


def _wandb_api() -> object | None:
    """``wandb.Api()`` when wandb is installed and a key is configured; else ``None``, said once."""
    try:
        import wandb
    except ImportError:
        click.echo("telescope ui: --wandb-project needs wandb: pip install 'telescope-ui-sync[wandb]'", err=True)
        return None
    from telescope.recording.wandb_logger import api_key_configured

    if not api_key_configured():
        click.echo("telescope ui: --wandb-project needs a W&B key (wandb login, or WANDB_API_KEY)", err=True)
        return None
    return wandb.Api()
