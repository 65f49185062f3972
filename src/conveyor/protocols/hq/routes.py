"""hq's endpoint table (seed 003, and hq's server/src/lib.rs): one row per route with the
role it needs. Served under /hq on the server's port and at the root of the hq port
(``conveyor serve --hq-port``); ``at_root`` is how the app sends the second to the first."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, Router
from starlette.types import ASGIApp, Receive, Scope, Send

from conveyor import errors
from conveyor.protocols.endpoints import guarded
from conveyor.protocols.hq import messages, queues
from conveyor.protocols.hq import request as req

log = logging.getLogger(__name__)

PREFIX = "/hq"

Handler = Callable[[Request], Awaitable[Response]]


@dataclasses.dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    handler: Handler
    role: str


ENDPOINTS = [
    Endpoint("POST", "/queues/{name}/enqueue", messages.enqueue, "write"),
    Endpoint("GET", "/queues/{name}/receive", messages.receive, "write"),
    Endpoint("PUT", "/messages/{id}/complete", messages.complete, "write"),
    Endpoint("PUT", "/messages/{id}/fail", messages.fail, "write"),
    Endpoint("GET", "/queues", queues.list_queues, "read"),
    Endpoint("POST", "/queues", queues.create, "admin"),
    Endpoint("GET", "/queues/{name}", queues.show, "read"),
    Endpoint("PUT", "/queues/{name}", queues.update, "admin"),
    Endpoint("DELETE", "/queues/{name}", queues.delete, "admin"),
]


async def _http_error(request: Request, exc: Exception) -> Response:
    """axum's answers: an unknown route or method has an empty body; a body over the
    server's limit (raised where it is read) is 413 in plain text."""
    assert isinstance(exc, HTTPException)
    if exc.status_code in (404, 405):
        return Response(status_code=exc.status_code, headers=exc.headers)
    return req.text(exc.status_code, str(exc.detail))


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return req.error(errors.InternalError("internal error"))


class _TrimSlash:
    """hq's NormalizePathLayer::trim_trailing_slash: /queues/ is /queues."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            scope = dict(scope, path=path.rstrip("/") or "/")
        await self.app(scope, receive, send)


def app(broker: object) -> ASGIApp:
    """The hq sub-application (mounted at ``PREFIX``)."""
    sub = Starlette(routes=[Route(e.path, guarded(e.handler, e.role, req.error, (errors.ConveyorError, req.HqError)),
                                       methods=[e.method]) for e in ENDPOINTS],
                    exception_handlers={HTTPException: _http_error, Exception: _internal_error})
    assert isinstance(sub.router, Router)
    sub.router.redirect_slashes = False
    sub.state.broker = broker
    return _TrimSlash(sub)


def at_root(scope: Scope) -> Scope:
    """A request to the hq port as the same request under ``PREFIX``."""
    moved = dict(scope, path=PREFIX + scope["path"])
    if scope.get("raw_path") is not None:
        moved["raw_path"] = PREFIX.encode() + scope["raw_path"]
    return moved
