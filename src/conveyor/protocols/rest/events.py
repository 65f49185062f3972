"""REST handlers for the native events API (topics without topic objects):
``/v1/events/{routing_key}`` (publish), ``/v1/events/{pattern}/subscriptions[/{id}]`` and
``/v1/queues/{name}/subscriptions``.

A pattern in a URL path writes ``#`` as ``%23`` (``/v1/events/orders.%23/subscriptions``).
REST subscriptions deliver the raw message unless ``"envelope": true`` asks for the signed
SNS envelope. Message headers become SNS message attributes (so filter policies see
them): a string a String, a number a Number, a list of strings and numbers a
String.Array, anything else a String holding its JSON text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors, types
from conveyor.core import topics
from conveyor.protocols.rest import models, render
from conveyor.protocols.rest import request as req
from conveyor.protocols.rest.context import broker

# -- rendering and conversion -------------------------------------------------------------

def subscription(s: types.Subscription) -> dict[str, Any]:
    return {
        "id": s.id, "uuid": str(s.uuid), "pattern": s.pattern, "protocol": s.protocol, "queue": s.queue,
        "endpoint": s.endpoint, "envelope": not s.raw_delivery, "filter_policy": s.filter_policy,
        "filter_policy_scope": s.filter_policy_scope, "confirmed": s.confirmed, "created_at": s.created_at,
    }



def attributes(headers: Mapping[str, Any] | None) -> dict[str, dict[str, str]] | None:
    """REST headers as SNS-typed message attributes."""
    if not headers:
        return None
    return {name: topics.header_attribute(value) for name, value in headers.items()}


def publication(spec: models.PublishIn) -> types.Publication:
    if isinstance(spec.message, str):
        body, content_type = spec.message, None
    else:
        body, content_type = orjson.dumps(spec.message).decode(), types.JSON_CONTENT_TYPE
    return types.Publication(body=body, subject=spec.subject, attributes=attributes(spec.headers),
                             group_id=spec.group_id, dedup_id=spec.dedup_id, delay=spec.delay,
                             content_type=content_type)


def _base_url(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.netloc}"


# -- handlers --------------------------------------------------------------------------------

async def publish_event(request: Request) -> Response:
    spec = await req.body(request, models.PublishIn)
    b = broker(request)
    published = await b.publish(request.path_params["routing_key"], publication(spec), b.topic_urls(_base_url(request)))
    return render.json({
        "message_id": str(published.message_id), "queues_matched": published.queues_matched,
        "endpoints_matched": published.endpoints, "queues": list(published.queues),
        "sequence_number": published.sequence_number,
        "messages": [{"queue": c.queue, "id": c.id, "message_id": str(c.message_uuid)} for c in published.messages],
    }, 201)


def _new_subscription(pattern: str, spec: models.EventSubscriptionIn) -> types.NewSubscription:
    protocol = spec.protocol or ("sqs" if spec.queue_name is not None else None)
    if protocol is None:
        raise errors.InvalidInput("invalid request: give queue_name (protocol sqs), or protocol http or https "
                                  "with an endpoint")
    if protocol == "sqs" and (spec.queue_name is None or spec.endpoint is not None):
        raise errors.InvalidInput("invalid request: an sqs subscription takes queue_name and no endpoint")
    if protocol != "sqs" and (spec.endpoint is None or spec.queue_name is not None):
        raise errors.InvalidInput(f"invalid request: an {protocol} subscription takes an endpoint and no queue_name")
    return types.NewSubscription(pattern=pattern, protocol=protocol, queue=spec.queue_name, endpoint=spec.endpoint,
                                 raw_delivery=not spec.envelope, filter_policy=spec.filter_policy,
                                 filter_policy_scope=spec.filter_policy_scope)


async def create_event_subscription(request: Request) -> Response:
    pattern = request.path_params["pattern"]
    spec = await req.body(request, models.EventSubscriptionIn)
    new = _new_subscription(pattern, spec)
    async with broker(request).connection() as conn:
        created = await topics.subscribe(conn, new)
    return render.json(subscription(created), 201,
                       headers={"Location": f"/v1/events/{pattern.replace('#', '%23')}/subscriptions/{created.id}"})


async def list_event_subscriptions(request: Request) -> Response:
    q = req.query(request, models.SubscriptionsQuery)
    async with broker(request).connection() as conn:
        found = await topics.subscriptions_list(conn, pattern=request.path_params["pattern"], after_id=q.after,
                                                limit=q.max)
    return render.json([subscription(s) for s in found])


async def _of_pattern(request: Request, conn: Any) -> types.Subscription:
    sid, pattern = req.path_id(request, "id", "subscription id"), request.path_params["pattern"]
    found = await topics.subscription_get(conn, sid)
    if found.pattern != pattern:
        raise errors.SubscriptionNotFound(f"subscription {sid} does not exist for pattern {pattern!r}")
    return found


async def get_event_subscription(request: Request) -> Response:
    async with broker(request).connection() as conn:
        found = await _of_pattern(request, conn)
    return render.json(subscription(found))


async def delete_event_subscription(request: Request) -> Response:
    async with broker(request).connection() as conn:
        found = await _of_pattern(request, conn)
        await topics.unsubscribe(conn, found.id)
    return Response(status_code=204)


async def list_queue_subscriptions(request: Request) -> Response:
    q = req.query(request, models.SubscriptionsQuery)
    async with broker(request).connection() as conn:
        found = await topics.subscriptions_list(conn, queue=req.queue_name(request), after_id=q.after, limit=q.max)
    return render.json([subscription(s) for s in found])
