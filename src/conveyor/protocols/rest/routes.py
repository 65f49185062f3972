"""The REST endpoint table: one row per operation, used for routing, role checks and the
OpenAPI document alike."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from conveyor import errors
from conveyor.protocols.rest import messages, models, openapi, queues, render

Handler = Callable[[Request], Awaitable[Response]]
ROLE_RANK = {"read": 0, "write": 1, "admin": 2}


@dataclasses.dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    handler: Handler
    role: str
    summary: str
    responses: dict[int, type[BaseModel] | None]
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    body_required: bool = True


Q = "/queues/{name}"
MSG = Q + "/messages/{id}"

ENDPOINTS = [
    Endpoint("GET", "/queues", queues.list_queues, "read", "List queues (optionally by name prefix)",
             {200: models.Queue}),
    Endpoint("POST", "/queues", queues.create_queue, "admin",
             "Create a queue (returns the existing one if every given attribute matches)",
             {201: models.Queue, 404: models.Error, 409: models.Error}, body=models.QueueCreate),
    Endpoint("GET", Q, queues.get_queue, "read", "A queue's attributes and metrics",
             {200: models.QueueDetail, 404: models.Error}),
    Endpoint("PATCH", Q, queues.alter_queue, "admin", "Change a queue's attributes (null resets one)",
             {200: models.Queue, 404: models.Error}, body=models.QueueAttributes),
    Endpoint("DELETE", Q, queues.delete_queue, "admin", "Delete a queue and its messages",
             {204: None, 404: models.Error}),
    Endpoint("POST", Q + "/purge", queues.purge_queue, "admin", "Delete every message of a queue",
             {200: models.Purged, 404: models.Error}),
    Endpoint("POST", Q + "/messages", messages.send, "write",
             "Send one message (object) or a batch (array); answered after commit",
             {201: models.Sent, 404: models.Error, 413: models.Error}, body=models.MessageIn),
    Endpoint("GET", Q + "/messages", messages.receive, "write",
             "Receive messages, hiding them for vt seconds; wait long-polls",
             {200: models.Message, 404: models.Error}, query=models.ReceiveQuery),
    Endpoint("DELETE", Q + "/messages", messages.delete_batch, "write", "Delete messages by id",
             {200: models.Deleted, 404: models.Error}, body=models.DeleteBatch),
    Endpoint("DELETE", MSG, messages.delete_one, "write", "Delete one message",
             {204: None, 404: models.Error}),
    Endpoint("PATCH", MSG, messages.change_visibility, "write", "Change a message's visibility timeout",
             {200: models.VisibilityChanged, 404: models.Error}, body=models.Visibility),
    Endpoint("POST", MSG + "/complete", messages.complete, "write",
             "Complete a message: move it to the archive", {204: None, 404: models.Error}),
    Endpoint("POST", MSG + "/fail", messages.fail, "write",
             "Fail a message: to the dead-letter queue, else to the archive as failed",
             {204: None, 404: models.Error}, body=models.Fail, body_required=False),
]


def _guarded(endpoint: Endpoint) -> Handler:
    """The handler behind its role check, with Conveyor errors rendered as REST errors."""

    @functools.wraps(endpoint.handler)
    async def handle(request: Request) -> Response:
        role = request.scope.get("conveyor.role")
        try:
            if role is not None and ROLE_RANK[role] < ROLE_RANK[endpoint.role]:
                raise errors.PermissionDenied(f"this needs the {endpoint.role} role; the token has {role}")
            return await endpoint.handler(request)
        except errors.ConveyorError as exc:
            return render.error(exc)

    return handle


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "NotFound", 405: "MethodNotAllowed", 413: "RequestTooLarge"}.get(exc.status_code, "HTTPError")
    return render.json({"error": exc.detail, "code": code}, exc.status_code)


async def _openapi(request: Request) -> Response:
    return render.json(openapi.document(ENDPOINTS, request.app.state.version))


def app(broker: object, version: str) -> Starlette:
    """The /v1 sub-application."""
    routes = [Route(e.path, _guarded(e), methods=[e.method]) for e in ENDPOINTS]
    routes.append(Route("/openapi.json", _openapi, methods=["GET"]))
    sub = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    sub.state.broker = broker
    sub.state.version = version
    return sub
