"""Two ASGI middlewares around the whole app: the ``Host`` check and ``HEAD`` answered as ``GET``.

Host check (DNS rebinding): a web page on another site can point its own name at
127.0.0.1 and then read this server from the browser as "same origin". The browser still
sends that name in the ``Host`` header, so only the names this server is reached by are
accepted (:func:`allowed_hosts`: the loopback names, the bound address and, when bound to
every interface, this machine's names and addresses, plus what ``--allow-host`` adds);
any other is refused with 400 and a message naming the option. Starlette's
``TrustedHostMiddleware`` makes the same decision but answers only "Invalid host
header", which does not say how to reach the dashboard by that name.

HEAD: FastAPI's GET routes answer HEAD with 405. A HEAD request is run as the GET it asks
about and only the response's status and headers (``Content-Length`` included) are sent;
the route does the work of a GET, which is fine for the rare HEAD (a link checker, ``curl -I``).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")


def machine_names() -> set[str]:
    """This machine's host names and the addresses they resolve to (empty where none resolve)."""
    names = {socket.gethostname(), socket.getfqdn()}
    for name in list(names):
        try:
            names.update(str(info[4][0]) for info in socket.getaddrinfo(name, None))
        except OSError:
            continue
    return {name for name in names if name}


def allowed_hosts(bound: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The host names a server bound to ``bound`` answers to: loopback, ``bound`` itself, this
    machine's names when ``bound`` is every interface, and ``extra`` (``--allow-host``)."""
    hosts = {*LOOPBACK_NAMES, *extra}
    if bound in WILDCARDS:
        hosts |= machine_names()
    else:
        hosts.add(bound)
    return frozenset(host.strip("[]").lower() for host in hosts)


def host_name(header: str) -> str | None:
    """The name in a ``Host`` header (no port, no brackets, lower case); None when malformed."""
    try:
        parsed = urlsplit(f"//{header}")
        parsed.port  # noqa: B018  (raises ValueError for a port that is not a number)
    except ValueError:
        return None
    return parsed.hostname


class HostCheck:
    """Refuses (400) a request whose ``Host`` header names a host outside ``hosts``."""

    def __init__(self, app: ASGIApp, hosts: Iterable[str]) -> None:
        self.app = app
        self.hosts = frozenset(hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # no websocket routes; lifespan passes
            await self.app(scope, receive, send)
            return
        header = next((value.decode("latin-1") for key, value in scope["headers"] if key == b"host"), "")
        name = host_name(header)
        if name in self.hosts:
            await self.app(scope, receive, send)
            return
        shown = name or header or "(none)"
        message = (
            f"telescope ui does not answer to the host name {shown!r} (a guard against DNS rebinding). "
            f"Open it by one of: {', '.join(sorted(self.hosts))}; or start telescope ui with "
            f"--allow-host {shown} to allow this name."
        )
        await PlainTextResponse(message, status_code=400)(scope, receive, send)


class HeadAsGet:
    """Runs a ``HEAD`` request as ``GET`` and sends the response without its body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)
