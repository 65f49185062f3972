"""The dashboard at /ui (issue 17): a static page (HTML, CSS and plain ES modules, no
build step, nothing from a CDN) served by the server itself, and the JSON it reads under
/ui/api. The page and its static files hold no data and load without credentials; every
/ui/api call carries the token the page asked for and passes the server's one
authentication policy and a role check (read to look, admin to replay or purge). Where
the REST API (/v1) or Queen's admin API (/api/v1) already answers what a page shows,
the page calls them; /ui/api adds what they lack (metrics of every queue at once, rates
and history, a queue's dead letters browsed without receiving them, redrive, message
lookup)."""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from conveyor.protocols.rest import routes as rest
from conveyor.server.ui import api

STATIC = Path(__file__).parent / "static"


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
