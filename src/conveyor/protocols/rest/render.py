"""REST responses: JSON via orjson, errors as {"error", "code"} with the status of the
error's class (one table)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from conveyor import errors, types

STATUS: dict[type[errors.ConveyorError], int] = {
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.MessageTooLarge: 413,
    errors.InvalidInput: 400,
    errors.Unauthorized: 401,
    errors.PermissionDenied: 403,
    errors.Unavailable: 503,
    errors.InternalError: 500,
}


def status_of(exc: errors.ConveyorError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def json(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content), status_code=status, headers=headers,
                    media_type="application/json")


def challenge(credentials_given: bool) -> str:
    """The ``WWW-Authenticate`` of a 401: how to authenticate (RFC 6750's Bearer scheme; the
    default header mode takes any Authorization header), and whether what came was refused."""
    return 'Bearer realm="conveyor", error="invalid_token"' if credentials_given else 'Bearer realm="conveyor"'


def error(exc: errors.ConveyorError) -> Response:
    headers = None
    if isinstance(exc, errors.Throttled):  # admission control says when to come back
        headers = {"Retry-After": "1"}
    elif isinstance(exc, errors.Unauthorized):
        headers = {"WWW-Authenticate": challenge(True)}
    return json({"error": exc.message, "code": type(exc).__name__}, status_of(exc), headers)


def queue(q: types.Queue) -> dict[str, Any]:
    return {
        "name": q.name, "fifo": q.fifo, **q.attributes(),
        "encrypted": q.encrypted, "is_partitioned": q.partitioned, "is_unlogged": q.unlogged,
        "storage": q.storage, "partitioning": q.partitioning,
        "created_at": q.created_at, "updated_at": q.updated_at,
    }


def queue_detail(q: types.Queue, m: types.QueueMetrics) -> dict[str, Any]:
    return {
        **queue(q),
        "queue_length": m.queue_length, "in_flight": m.in_flight, "delayed": m.delayed,
        "newest_msg_age_sec": m.newest_msg_age_sec, "oldest_msg_age_sec": m.oldest_msg_age_sec,
        "total_messages": m.total_messages, "dead_letter_length": m.dead_letter_length,
        "scrape_time": m.scrape_time,
    }


def message(m: types.Message, receipt: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": m.id,
        "receipt": receipt,
        # JSON bodies are embedded as they were stored, without a parse/serialise round trip
        "message": orjson.Fragment(m.body) if m.is_json else m.body,
        "headers": m.headers,
        "receive_count": m.receive_count,
        "sent_at": m.sent_at,
        "first_received_at": m.first_received_at,
        "visible_at": m.vt,
    }
    if m.group_id is not None:
        out["group_id"] = m.group_id
        out["dedup_id"] = m.dedup_id
    traceparent = (m.system_attributes or {}).get("traceparent")
    if traceparent:  # the sender's trace, for the consumer to continue (conveyor.tracing)
        out["traceparent"] = traceparent.get("StringValue")
    if m.sender_id is not None:
        out["sender_id"] = m.sender_id
    return out
