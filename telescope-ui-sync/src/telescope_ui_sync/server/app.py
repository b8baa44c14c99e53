"""The FastAPI application: the JSON API routers and the built front end.

:func:`create_app` takes an open DuckDB connection and (optionally) the running
:class:`~telescope_ui_sync.sync.syncer.SyncService`; tests build it over a database they
synced themselves. The front end is a single page (hash routing) served from the
package's ``static/`` folder with a strict Content-Security-Policy: scripts only from
this origin, no inline script, no network access beyond this origin, so even a model
output that slipped through unescaped could not run or phone home. Around it all,
:mod:`.guards`: requests naming another host than ``hosts`` (loopback by default) are
refused, against DNS rebinding, and every GET route answers ``HEAD``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import duckdb
from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from telescope_ui_sync import __version__
from telescope_ui_sync.server import api_code, api_metrics, api_misc, api_rollouts, api_runs, api_timeline
from telescope_ui_sync.server.deps import AppState
from telescope_ui_sync.server.guards import HeadAsGet, HostCheck, allowed_hosts
from telescope_ui_sync.sync.syncer import SyncService

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

NOT_BUILT = """<!doctype html><title>telescope ui</title><body style="font-family:sans-serif">
<h1>telescope ui: the front end is not built</h1>
<p>The API is up (<a href="/api/runs">/api/runs</a>). Build the front end with <code>./dev setup</code>
or <code>python -m telescope_ui_sync.build</code> (needs Node.js and npm).</p></body>"""


def create_app(
    con: duckdb.DuckDBPyConnection,
    service: SyncService | None = None,
    static_dir: Path = STATIC_DIR,
    hosts: Iterable[str] | None = None,
) -> FastAPI:
    """The dashboard app over ``con`` (routes read through a cursor each), answering requests
    whose ``Host`` is one of ``hosts`` (default: the loopback names; see :func:`.guards.allowed_hosts`)."""
    app = FastAPI(title="telescope ui", version=__version__, docs_url="/api/docs", openapi_url="/api/openapi.json")
    app.state.telescope = AppState(con=con, service=service)
    for module in (api_runs, api_metrics, api_rollouts, api_timeline, api_misc, api_code):
        app.include_router(module.router)

    @app.middleware("http")
    async def security_headers(request, call_next):  # type: ignore[no-untyped-def]
        response: Response = await call_next(request)
        for key, value in SECURITY_HEADERS.items():
            response.headers.setdefault(key, value)
        return response

    index = static_dir / "index.html"
    app.mount("/assets", StaticFiles(directory=static_dir / "assets", check_dir=False), name="assets")

    @app.get("/", include_in_schema=False)
    def home() -> Response:
        if index.is_file():
            return FileResponse(index, headers={"Cache-Control": "no-cache"})
        return HTMLResponse(NOT_BUILT)

    app.add_middleware(HeadAsGet)
    app.add_middleware(HostCheck, hosts=allowed_hosts("127.0.0.1") if hosts is None else hosts)
    return app
