"""hq's queue routes: /queues and /queues/{name}. An hq queue is a Conveyor queue:
``max_attempts`` is its max_receive_count (past it a message is failed: archived, or
moved to the queue's dead-letter queue if it has one), ``visibility_timeout_seconds`` its
visibility timeout."""

from __future__ import annotations

import contextlib
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors, types
from conveyor.core import queues
from conveyor.protocols.hq import request as req

MAX_ATTEMPTS = 1000  # Conveyor's bound on max_receive_count
MAX_VISIBILITY = 43200  # and on visibility timeouts (12 hours, as SQS)
NO_LIMIT = -1  # max_attempts of a queue without a receive limit (hq's column default)


def render(q: types.Queue) -> dict[str, Any]:
    """hq's ShowQueueResponse, in its field order."""
    return {
        "name": q.name,
        "max_attempts": q.max_receive_count if q.max_receive_count is not None else NO_LIMIT,
        "visibility_timeout_seconds": q.visibility_timeout,
        "inserted_at": req.timestamp(q.created_at),
        "updated_at": req.timestamp(q.updated_at),
    }


def _options(params: dict[str, str], *, required: bool) -> dict[str, int]:
    """max_attempts and visibility_timeout_seconds as Conveyor attributes, checked as hq
    checks them (both >= 1) and against Conveyor's upper bounds."""
    attempts = req.integer(params, "max_attempts", required=required)
    visibility = req.integer(params, "visibility_timeout_seconds", required=required)
    req.in_range("max_attempts", attempts, MAX_ATTEMPTS)
    req.in_range("visibility_timeout_seconds", visibility, MAX_VISIBILITY)
    found = {"max_receive_count": attempts, "visibility_timeout": visibility}
    return {k: v for k, v in found.items() if v is not None}


async def create(request: Request) -> Response:
    params = req.query(request)
    name = req.string(params, "name")
    attributes = _options(params, required=True)
    async with req.broker(request).connection() as conn:
        try:
            await queues.get(conn, name)
        except errors.QueueNotFound:
            await queues.create(conn, name, attributes)
            return req.empty()
    raise req.HqError(409, "Error: queue name must be unique")


async def list_queues(request: Request) -> Response:
    async with req.broker(request).connection() as conn:
        found = await queues.list_all(conn)
    return req.json([render(q) for q in sorted(found, key=lambda q: q.name)])


async def show(request: Request) -> Response:
    """The queue, or ``null`` (hq's ``Option``) if there is none."""
    async with req.broker(request).connection() as conn:
        try:
            q = await queues.get(conn, request.path_params["name"])
        except (errors.QueueNotFound, errors.InvalidInput):  # a name no queue can have: none
            return req.json(None)
    return req.json(render(q))


async def update(request: Request) -> Response:
    """Change the given options; as in hq, a queue that does not exist is no error."""
    attributes = _options(req.query(request), required=False)
    if not attributes:
        return req.empty()
    async with req.broker(request).connection() as conn:
        with contextlib.suppress(errors.QueueNotFound):  # hq's UPDATE ... WHERE name = ? of no row
            await queues.alter(conn, request.path_params["name"], attributes)
    return req.empty()


async def delete(request: Request) -> Response:
    """Delete the queue and its messages; as in hq, one that does not exist is no error."""
    async with req.broker(request).connection() as conn:
        await queues.drop(conn, request.path_params["name"])
    return req.empty()
