"""REST handlers for messages: /v1/queues/{name}/messages[/{id}[/complete|/fail]]."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors, types
from conveyor.protocols.rest import models, render
from conveyor.protocols.rest import request as req
from conveyor.protocols.rest.context import broker


def _outgoing(m: models.MessageIn) -> types.OutgoingMessage:
    if isinstance(m.message, str):
        body, content_type = m.message, None
    else:
        body, content_type = orjson.dumps(m.message).decode(), types.JSON_CONTENT_TYPE
    return types.OutgoingMessage(body=body, headers=m.headers, delay=m.delay, content_type=content_type,
                                 group_id=m.group_id, dedup_id=m.dedup_id)


async def send(request: Request) -> Response:
    raw = await request.body()
    try:
        data = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError as exc:
        raise errors.InvalidInput(f"invalid request: the body is not valid JSON ({exc.msg})") from None
    if not isinstance(data, (dict, list)):
        raise errors.InvalidInput("invalid request: the body must be a message object or an array of message objects")
    if isinstance(data, list):
        batch = req.validate(models.SendBatch, data).root
        sent = await broker(request).send(req.queue_name(request), [_outgoing(m) for m in batch])
        return render.json({"ids": [s.id for s in sent]}, 201)
    single = req.validate(models.MessageIn, data)
    [sent] = await broker(request).send(req.queue_name(request), [_outgoing(single)])
    return render.json({"id": sent.id}, 201)


async def receive(request: Request) -> Response:
    q = req.query(request, models.ReceiveQuery)
    got = await broker(request).receive(req.queue_name(request),
                                        types.ReceiveParams(qty=q.max, vt=q.vt, wait=q.wait))
    return render.json([render.message(m) for m in got])


async def delete_batch(request: Request) -> Response:
    spec = await req.body(request, models.DeleteBatch)
    done = await broker(request).delete(req.queue_name(request), spec.ids)
    return render.json({"deleted": done})


def _not_found(request: Request, mid: int) -> Response:
    return render.error(errors.MessageNotFound(
        f"message {mid} does not exist in queue {req.queue_name(request)!r}"))


async def delete_one(request: Request) -> Response:
    mid = req.message_id(request)
    if not await broker(request).delete(req.queue_name(request), [mid]):
        return _not_found(request, mid)
    return Response(status_code=204)


async def change_visibility(request: Request) -> Response:
    mid = req.message_id(request)
    spec = await req.body(request, models.Visibility)
    changed = await broker(request).set_vt(req.queue_name(request), [mid], spec.vt)
    if not changed:
        return _not_found(request, mid)
    return render.json({"id": mid, "visible_at": changed[0].vt})


async def complete(request: Request) -> Response:
    mid = req.message_id(request)
    if not await broker(request).archive(req.queue_name(request), [mid]):
        return _not_found(request, mid)
    return Response(status_code=204)


async def fail(request: Request) -> Response:
    mid = req.message_id(request)
    raw = await request.body()
    reason = (await req.body(request, models.Fail)).error if raw else None
    if not await broker(request).fail(req.queue_name(request), mid, reason):
        return _not_found(request, mid)
    return Response(status_code=204)
