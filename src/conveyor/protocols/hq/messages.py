"""hq's message routes: enqueue, receive, complete, fail.

An hq message is a Conveyor message: ``args`` is its body (JSON), its ``id`` the
message's UUID (the SQS MessageId), ``attempts`` its receive count. Sends and receives go
through the broker (fusion, long polls, metrics, admission).

Only the consumer holding the current delivery may complete or fail a message. hq's
clients name a message by id alone, so without more a delivery counts as held while it
is in flight (received and still invisible: hq's "locked"): a message never received,
whose visibility timeout ran out, or already completed or failed is refused. A receive
also answers the delivery's receipt in ``X-Conveyor-Receipt``; a consumer that passes it
back (``?receipt=``) is refused once anyone else has received the message since, which
the id alone cannot tell.
"""

from __future__ import annotations

import uuid

import orjson
from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors, json_input, types
from conveyor.core import hq
from conveyor.protocols.hq import request as req

RECEIPT_HEADER = "X-Conveyor-Receipt"


def _check_json(body: bytes) -> str:
    """The body as text, if it is one JSON value (hq stores what it was sent, once it
    parses) nested no deeper than hq's parser takes (``json_input.MAX_DEPTH``)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise req.HqError(400, f"Request body didn't contain valid UTF-8: {exc.reason}") from None
    try:  # integers past 64 bits too, as serde_json takes them
        json_input.loads(body, big_integers=True)
    except json_input.TooDeep as exc:
        raise req.HqError(400, f"Failed to parse the request body as JSON: {exc.msg}") from None
    except orjson.JSONDecodeError as exc:
        raise req.HqError(400, f"Failed to parse the request body as JSON: {exc.msg} at line {exc.lineno} "
                               f"column {exc.colno}") from None
    return text


async def enqueue(request: Request) -> Response:
    body = _check_json(await request.body())
    message = types.OutgoingMessage(body=body, content_type=types.JSON_CONTENT_TYPE)
    [sent] = await req.broker(request).send(request.path_params["name"], [message])
    return req.json({"message_id": str(sent.message_uuid)})


def _args(body: str) -> bytes:
    """The body as hq answers ``args``: re-serialised compactly, object keys sorted (its
    serde_json Value); a body hq could not have taken (sent through another API: not
    JSON, nested deeper than hq reads, integers orjson cannot write) as a string."""
    try:
        return orjson.dumps(json_input.loads(body, big_integers=True), option=orjson.OPT_SORT_KEYS)
    except (ValueError, TypeError):  # orjson.JSONDecodeError and TooDeep; orjson.JSONEncodeError
        return orjson.dumps(body)


def _message(m: types.Message, queue: str) -> bytes:
    """hq's Message, in its field order: id, args, queue, attempts."""
    return b"".join((b'{"id":', orjson.dumps(str(m.message_uuid)), b',"args":', _args(m.body),
                     b',"queue":', orjson.dumps(queue), b',"attempts":', str(m.receive_count).encode(), b"}"))


async def receive(request: Request) -> Response:
    """One message, or ``null``: none visible, or (as in hq) no such queue."""
    name = request.path_params["name"]
    b = req.broker(request)
    try:
        got = await b.receive(name, types.ReceiveParams(qty=1))
    except (errors.QueueNotFound, errors.InvalidInput):  # hq: a join that finds nothing
        got = []
    if not got:
        return req.json(None)
    m = got[0]
    return req.raw_json(_message(m, name), {RECEIPT_HEADER: b.receipts.encode(name, m.id, m.receive_count)})


async def _locate(request: Request, message_uuid: uuid.UUID) -> hq.Located:
    try:
        async with req.broker(request).connection() as conn:
            found = await hq.locate(conn, message_uuid)
    except errors.SchemaMissing:  # 3F000 no schema hq, 42883 no function (SchemaOutdated)
        raise errors.Unavailable("hq's message routes need the hq dialect: start the server with "
                                 "CONVEYOR_DIALECTS=hq (or --hq-port), or run `conveyor db migrate --dialects hq`") \
            from None
    if found is None:
        raise req.HqError(404, f"Error: message {message_uuid} does not exist, or was already completed or failed")
    return found


def _not_held(message_uuid: uuid.UUID) -> req.HqError:
    return req.HqError(409, f"Error: message {message_uuid} is not locked by this consumer: it was not received, "
                            "or its visibility timeout ran out, or another consumer has received it since")


async def _delivery(request: Request) -> tuple[hq.Located, types.MessageRef]:
    """The message of the route and the delivery the caller holds, or hq's refusal."""
    message_uuid = req.message_id(request)
    receipt = req.query(request).get("receipt")
    found = await _locate(request, message_uuid)
    if not found.in_flight:
        raise _not_held(message_uuid)
    if receipt is None:
        return found, types.MessageRef(found.id, found.receive_count)
    held = req.broker(request).receipts.decode(receipt, found.queue_name)
    if held is None or held.message_id != found.id:
        raise req.HqError(400, f"Error: invalid receipt {receipt[:60]!r}: not one of message {message_uuid}")
    if held.receive_count != found.receive_count:
        raise _not_held(message_uuid)
    return found, types.MessageRef(found.id, held.receive_count)


async def complete(request: Request) -> Response:
    found, delivery = await _delivery(request)
    if not await req.broker(request).archive(found.queue_name, [delivery]):
        raise _not_held(req.message_id(request))  # received again in between
    return req.empty()


async def fail(request: Request) -> Response:
    """To the queue's dead-letter queue if it has one, else to the archive as failed."""
    found, delivery = await _delivery(request)
    if not await req.broker(request).fail(found.queue_name, delivery, "failed by consumer (hq)"):
        raise _not_held(req.message_id(request))
    return req.empty()
