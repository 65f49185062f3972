"""REST handlers for messages: /v1/queues/{name}/messages[/{id}[/complete|/fail]]."""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors, types
from conveyor.core import messages
from conveyor.protocols.rest import models, render
from conveyor.protocols.rest import request as req
from conveyor.protocols.rest.context import broker


def _outgoing(m: models.MessageIn, sender: str | None) -> types.OutgoingMessage:
    if isinstance(m.message, str):
        body, content_type = m.message, None
    else:
        body, content_type = orjson.dumps(m.message).decode(), types.JSON_CONTENT_TYPE
    return types.OutgoingMessage(body=body, headers=m.headers, delay=m.delay, content_type=content_type,
                                 group_id=m.group_id, dedup_id=m.dedup_id, sender_id=sender)


def _sender(request: Request) -> str | None:
    """Who sends: the principal the server verified (a JWT's sub), never what the client says."""
    identity = request.scope.get("conveyor.identity")
    return identity.principal if identity is not None else None


async def send(request: Request) -> Response:
    raw = await request.body()
    data = req.parse(raw) if raw else None
    if not isinstance(data, (dict, list)):
        raise errors.InvalidInput("invalid request: the body must be a message object or an array of message objects")
    b = broker(request)
    spool = b.spools("rest")
    if isinstance(data, list):
        batch = req.validate(models.SendBatch, data).root
        sender = _sender(request)
        sent = await b.send(req.queue_name(request), [_outgoing(m, sender) for m in batch], spool=spool)
        if sent and sent[0].spooled:  # the database is away: taken, durably, by the failover spool
            return render.json({"ids": None, "message_ids": [str(s.message_uuid) for s in sent], "spooled": True}, 202)
        return render.json({"ids": [s.id for s in sent]}, 201)
    single = req.validate(models.MessageIn, data)
    [one] = await b.send(req.queue_name(request), [_outgoing(single, _sender(request))], spool=spool)
    if one.spooled:
        return render.json({"id": None, "message_id": str(one.message_uuid), "spooled": True}, 202)
    return render.json({"id": one.id}, 201)


async def receive(request: Request) -> Response:
    q = req.query(request, models.ReceiveQuery)
    name = req.queue_name(request)
    b = broker(request)
    got = await b.receive(name, types.ReceiveParams(qty=q.max, vt=q.vt, wait=q.wait, grouped=q.fifo))
    return render.json([render.message(m, b.receipts.encode(name, m.id, m.receive_count)) for m in got])


def _delivery(request: Request, receipt: str) -> types.MessageRef:
    """The delivery a receipt names, refused unless it is one of this queue's."""
    found = broker(request).receipts.decode(receipt, req.queue_name(request))
    if found is None:
        raise errors.InvalidInput(f"invalid receipt {receipt[:60]!r}: not a receipt of queue "
                                  f"{req.queue_name(request)!r}")
    return types.MessageRef(found.message_id, found.receive_count)


def _target(request: Request) -> types.MessageRef:
    """The message of a /messages/{id} route, at the delivery its ?receipt= names if any."""
    mid = req.message_id(request)
    receipt = req.query(request, models.ReceiptQuery).receipt
    if receipt is None:
        return types.MessageRef(mid)
    delivery = _delivery(request, receipt)
    if delivery.id != mid:
        raise errors.InvalidInput(f"the receipt is for message {delivery.id}, not {mid}")
    return delivery


async def delete_batch(request: Request) -> Response:
    spec = await req.body(request, models.DeleteBatch)
    if (spec.ids is None) == (spec.receipts is None):
        raise errors.InvalidInput("invalid request: give either ids or receipts")
    deliveries = ([types.MessageRef(i) for i in spec.ids] if spec.ids is not None
                  else [_delivery(request, r) for r in spec.receipts or ()])
    done = await broker(request).delete(req.queue_name(request), deliveries)
    return render.json({"deleted": done})


async def _missed(request: Request, delivery: types.MessageRef) -> Response:
    """Why acting on a delivery did nothing: the message is gone (404), or it was received
    again since the receipt was given out (409)."""
    queue = req.queue_name(request)
    if delivery.receive_count is not None:
        async with broker(request).connection() as conn:
            still = await messages.peek(conn, queue, qty=1, after_id=delivery.id - 1)
        if still and still[0].id == delivery.id:
            return render.error(errors.StaleReceipt(
                f"message {delivery.id} was received again after this receipt was given out; "
                "only the newest delivery's receipt acts on it"))
    return render.error(errors.MessageNotFound(f"message {delivery.id} does not exist in queue {queue!r}"))


async def delete_one(request: Request) -> Response:
    delivery = _target(request)
    if not await broker(request).delete(req.queue_name(request), [delivery]):
        return await _missed(request, delivery)
    return Response(status_code=204)


async def change_visibility(request: Request) -> Response:
    delivery = _target(request)
    spec = await req.body(request, models.Visibility)
    changed = await broker(request).set_vt(req.queue_name(request), [delivery], spec.vt)
    if not changed:
        return await _missed(request, delivery)
    return render.json({"id": delivery.id, "visible_at": changed[0].vt})


async def complete(request: Request) -> Response:
    delivery = _target(request)
    if not await broker(request).archive(req.queue_name(request), [delivery]):
        return await _missed(request, delivery)
    return Response(status_code=204)


async def fail(request: Request) -> Response:
    delivery = _target(request)
    raw = await request.body()
    reason = (await req.body(request, models.Fail)).error if raw else None
    if not await broker(request).fail(req.queue_name(request), delivery, reason):
        return await _missed(request, delivery)
    return Response(status_code=204)
