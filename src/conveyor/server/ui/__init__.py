"""The dashboard at /ui (issue 17): a static page (HTML, CSS and plain ES modules, no
build step, nothing from a CDN) served by the server itself, and the JSON it reads under
/ui/api. The page and its static files hold no data and load without credentials; every
/ui/api call carries the token the page asked for and passes the server's one
authentication policy and a role check (read to look, admin to replay or purge). Where
the REST API (/v1) or Queen's admin API (/api/v1) already answers what a page shows,
the page calls them; /ui/api adds what they lack (metrics of every queue at once, rates
and history, a queue's dead letters browsed without receiving them, redrive, message
lookup).

Every answer under /ui carries a strict Content-Security-Policy: the page loads its
scripts, styles and data from this server only and runs no inline script or style (colours
are set through the DOM's style object, which the policy allows), so an injected
``<script>`` or ``style=""`` would not run, and no other site may frame it (clickjacking of
the admin's replay and purge buttons); ``nosniff`` keeps a response from being read as
another type than it says.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.protocols.rest import routes as rest
from conveyor.server.ui import api

STATIC = Path(__file__).parent / "static"

# The favicon is an empty data: URL (no request); everything else comes from this origin.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),  # frame-ancestors for browsers that predate it
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class SecurityHeaders:
    """Adds ``SECURITY_HEADERS`` to every response under ``prefix``, errors included. The
    server wraps its whole stack in it, so its own refusals of /ui requests (401 before
    authentication, 503 under overload) carry the headers as the dashboard's answers do."""

    def __init__(self, app: ASGIApp, prefix: str = "/ui") -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == self.prefix or path.startswith(self.prefix + "/")):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _index(request: Request) -> Response:
    if request.url.path == "/ui":
        return RedirectResponse("/ui/", status_code=308)
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


def app(broker: object, auth_mode: str, interval: float) -> Starlette:
    """The /ui sub-application."""
    sub = Starlette(routes=[
        Route("/", _index, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
        Mount("/api", api.app(broker, auth_mode, interval)),
    ], exception_handlers={HTTPException: rest.http_error})
    return sub
