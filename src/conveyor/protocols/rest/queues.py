"""REST handlers for queues: /v1/queues and /v1/queues/{name}."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors
from conveyor.core import queues
from conveyor.protocols.rest import models, render
from conveyor.protocols.rest import request as req
from conveyor.protocols.rest.context import broker


async def list_queues(request: Request) -> Response:
    prefix = request.query_params.get("prefix")
    async with broker(request).connection() as conn:
        found = await queues.list_all(conn, prefix)
    return render.json([render.queue(q) for q in found])


def _fifo_name(name: str, fifo: bool | None) -> str:
    """The queue's name: ``{"name": "orders", "fifo": true}`` is the FIFO queue
    ``orders.fifo`` (a FIFO queue's name ends in .fifo on every surface: REST paths, SQS
    queue URLs, SQL)."""
    if not fifo or name.endswith(".fifo"):
        return name
    base = name.rpartition(":")[2]  # a region prefix (eu-west-1:orders) is not counted
    if len(base) > 75:
        raise errors.InvalidInput(f"invalid queue name {name!r}: a FIFO queue's name is at most 75 characters "
                                  "before its .fifo suffix")
    return name + ".fifo"


def _encryption(request: Request, attributes: dict[str, Any]) -> dict[str, Any]:
    """``encrypted`` is kept with the queue's extra attributes (conveyor.crypto); asking for
    it needs a server that holds a key."""
    if "encrypted" not in attributes:
        return attributes
    encrypted = attributes.pop("encrypted")
    if encrypted and not broker(request).can_encrypt():
        raise errors.InvalidInput("encrypted queues need the server's encryption key (CONVEYOR_ENCRYPTION_KEY), "
                                  "which this server does not have")
    return {**attributes, "extra_attributes": {"encrypted": bool(encrypted)}}


async def create_queue(request: Request) -> Response:
    spec = await req.body(request, models.QueueCreate)
    attributes = _encryption(request, spec.model_dump(exclude_unset=True, exclude={"name"}))
    async with broker(request).connection() as conn:
        q = await queues.create(conn, _fifo_name(spec.name, spec.fifo), attributes)
    return render.json(render.queue(q), 201, headers={"Location": f"/v1/queues/{q.name}"})


async def get_queue(request: Request) -> Response:
    name = req.queue_name(request)
    async with broker(request).connection() as conn:
        q = await queues.get(conn, name)
        m = await queues.metrics(conn, name)
    return render.json(render.queue_detail(q, m))


async def alter_queue(request: Request) -> Response:
    attributes = _encryption(request, (await req.body(request, models.QueueAttributes)).model_dump(exclude_unset=True))
    async with broker(request).connection() as conn:
        q = await queues.alter(conn, req.queue_name(request), attributes)
    return render.json(render.queue(q))


async def delete_queue(request: Request) -> Response:
    async with broker(request).connection() as conn:
        dropped = await queues.drop(conn, req.queue_name(request))
    if not dropped:
        return render.error(errors.QueueNotFound(f"queue {req.queue_name(request)!r} does not exist"))
    return Response(status_code=204)


async def purge_queue(request: Request) -> Response:
    async with broker(request).connection() as conn:
        n = await queues.purge(conn, req.queue_name(request))
    return render.json({"deleted": n})
