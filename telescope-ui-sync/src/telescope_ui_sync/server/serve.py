"""Run ``telescope ui``: open the database, start syncing, serve until interrupted."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import webbrowser
from collections.abc import Sequence
from pathlib import Path

import duckdb
import uvicorn

from telescope.system.addressing import bound_socket
from telescope_ui_sync.server.app import create_app
from telescope_ui_sync.server.guards import allowed_hosts
from telescope_ui_sync.sync.schema import SchemaVersionError, connect
from telescope_ui_sync.sync.syncer import SyncService


def serve(
    roots: Sequence[Path],
    *,
    db_path: Path,
    host: str,
    port: int,
    poll_interval: float = 0.5,
    open_browser: bool = False,
    wandb_api: object | None = None,
    wandb_projects: Sequence[str] = (),
    allow_hosts: Sequence[str] = (),
) -> None:
    """Sync ``roots`` into ``db_path`` in the background and serve the dashboard on ``host:port``,
    to requests naming ``host``, a loopback name or one of ``allow_hosts`` (see :mod:`.guards`)."""
    try:  # bound here, not by uvicorn: the URL printed names the real port (--port 0), and a port in
        sock = bound_socket(host, port)  # use is a clear error before the database opens and the sync starts
    except OSError as exc:
        sys.exit(
            f"telescope ui: cannot listen on {host}:{port} ({exc.strerror or exc}); pass another --port "
            "(0: any free port)"
        )
    with contextlib.closing(sock):
        hosts = allowed_hosts(host, allow_hosts)
        _serve(sock, roots, db_path, host, hosts, poll_interval, open_browser, wandb_api, wandb_projects)


def _serve(
    sock: socket.socket,
    roots: Sequence[Path],
    db_path: Path,
    host: str,
    hosts: frozenset[str],
    poll_interval: float,
    open_browser: bool,
    wandb_api: object | None,
    wandb_projects: Sequence[str],
) -> None:
    try:
        con = connect(db_path)
    except duckdb.IOException as exc:
        sys.exit(f"telescope ui: cannot open {db_path} ({exc}); is another telescope ui using it? Pass --db.")
    except SchemaVersionError as exc:
        sys.exit(f"telescope ui: {exc}")
    service = SyncService(
        con.cursor(), roots, poll_interval=poll_interval, wandb_api=wandb_api, wandb_projects=wandb_projects
    )
    service.start()  # syncs in the background; pages poll, so data appears as it is synced
    app = create_app(con, service, hosts=hosts)
    port = int(sock.getsockname()[1])  # the port the system chose for --port 0
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/"
    print(f"telescope ui: serving {', '.join(map(str, roots))} at {url} (database {db_path})", file=sys.stderr)
    if open_browser:
        threading.Timer(1.0, webbrowser.open, [url]).start()
    try:
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    finally:
        service.stop()
        con.close()
