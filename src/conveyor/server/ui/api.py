"""The dashboard's JSON under /ui/api: one row per endpoint with the role it needs, as the
REST and Queen tables do; errors in the REST API's format ({"error", "code"})."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from conveyor import errors, types
from conveyor.core import history, messages, move_tasks, queues, streams, topics
from conveyor.protocols import endpoints
from conveyor.protocols.broker import Broker
from conveyor.protocols.rest import render
from conveyor.protocols.rest import routes as rest

Handler = Callable[[Request], Awaitable[Response]]

MAX_MINUTES = 7 * 24 * 60
MAX_PEEK = 500


def _plain(value: Any) -> Any:
    """What orjson does not know: rates (Decimal) as numbers, intervals as seconds."""
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _json(content: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(content, default=_plain), status_code=status, media_type="application/json")


def _row(value: Any) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}


def _broker(request: Request) -> Broker:
    found: Broker = request.app.state.broker
    return found


def _integer(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    value = request.query_params.get(name, "")
    if value == "":
        return default
    if not (value.isascii() and value.isdigit()) or not lo <= int(value) <= hi:
        raise errors.InvalidInput(f"{name} must be a whole number from {lo} to {hi}, got {value[:40]!r}")
    return int(value)


def _by_name(found: list[Any]) -> dict[str, Any]:
    return {r.name: r for r in found}


# -- who is looking ----------------------------------------------------------------------

async def whoami(request: Request) -> Response:
    identity = endpoints.identity(request)
    return _json({"role": identity.role, "principal": identity.principal, "auth_mode": request.app.state.auth_mode,
                  "may_admin": identity.may("admin")})


# -- queues ------------------------------------------------------------------------------

async def list_queues(request: Request) -> Response:
    """Every queue with its metrics and latest rates, in two SQL calls and a third for the
    rates, however many queues there are."""
    async with _broker(request).connection() as conn:
        found = await queues.list_all(conn)
        metrics = {m.queue_name: m for m in await queues.metrics_all(conn)}
        rates = _by_name(await history.rates(conn, "queue"))
    dead_letter_of: dict[str, list[str]] = {}
    for q in found:
        if q.dead_letter_queue:
            dead_letter_of.setdefault(q.dead_letter_queue, []).append(q.name)
    out = []
    for q in found:
        m, r = metrics.get(q.name), rates.get(q.name)
        out.append({"name": q.name, "fifo": q.fifo, "storage": q.storage, "partitioning": q.partitioning,
                    "max_receive_count": q.max_receive_count,
                    "dead_letter_queue": q.dead_letter_queue, "dead_letter_of": dead_letter_of.get(q.name, []),
                    "depth": m.queue_length if m else 0, "in_flight": m.in_flight if m else 0,
                    "delayed": m.delayed if m else 0, "oldest_age_sec": m.oldest_msg_age_sec if m else None,
                    "total_sent": m.total_messages if m else 0,
                    "dead_letter_length": m.dead_letter_length if m else 0,
                    "sent_per_sec": r.sent_per_sec if r else None, "done_per_sec": r.done_per_sec if r else None})
    return _json(out)


def _message(m: types.Message) -> dict[str, Any]:
    return {"id": m.id, "message_uuid": m.message_uuid, "sent_at": m.sent_at, "visible_at": m.vt,
            "receive_count": m.receive_count, "first_received_at": m.first_received_at, "body": m.body,
            "content_type": m.content_type, "headers": m.headers, "group_id": m.group_id}


async def peek_messages(request: Request) -> Response:
    """A queue's messages, oldest first, without receiving them (a dead-letter queue
    browsed): ``limit``, and ``after`` (an id) for the next page."""
    name = request.path_params["name"]
    limit = _integer(request, "limit", 50, 1, MAX_PEEK)
    after = _integer(request, "after", 0, 0, 2**63 - 1)
    async with _broker(request).connection() as conn:
        await queues.get(conn, name)  # QueueNotFound, 404
        found = await messages.peek(conn, name, limit, after)
    return _json([_message(m) for m in _broker(request).opened(found)])


async def start_redrive(request: Request) -> Response:
    """Move a dead-letter queue's messages back to the queues they came from (SQS's
    StartMessageMoveTask; the server's move-tasks worker does the moving)."""
    async with _broker(request).connection() as conn:
        task = await move_tasks.start(conn, request.path_params["name"])
    return _json(_row(task), 202)


async def list_redrives(request: Request) -> Response:
    async with _broker(request).connection() as conn:
        found = await move_tasks.list_for(conn, request.path_params["name"], 10)
    return _json([_row(t) for t in found])


async def message_history(request: Request) -> Response:
    """A search, not a resource: a message (or queue) not found is an answer, ``found``
    false with the reason, not an error the browser would log."""
    name = request.path_params["name"]
    raw = request.path_params["id"]
    if not (raw.isascii() and raw.isdigit()) or int(raw) >= 2**63:
        raise errors.InvalidInput(f"a message id is a whole number, got {raw[:40]!r}")
    try:
        async with _broker(request).connection() as conn:
            found = await history.message(conn, name, int(raw))
    except errors.QueueNotFound as exc:
        return _json({"found": False, "error": exc.message})
    if found is None:
        return _json({"found": False, "error": f"queue {name[:80]!r} has no message {raw}, live or archived"})
    return _json({"found": True, **found})


# -- streams, topics ---------------------------------------------------------------------

async def list_streams(request: Request) -> Response:
    async with _broker(request).connection() as conn:
        stats = await streams.stats(conn)
        consumers = await streams.consumer_stats(conn)
    return _json([{**_row(s), "consumer_list": [_row(c) for c in consumers if c.stream == s.stream]}
                  for s in stats])


def _endpoint(url: str | None) -> str | None:
    """A webhook URL without the credentials it may carry (user:password@)."""
    if url is None:
        return None
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=host))


def _subscription(s: types.Subscription) -> dict[str, Any]:
    return {"id": s.id, "uuid": s.uuid, "pattern": s.pattern, "protocol": s.protocol, "queue": s.queue,
            "endpoint": _endpoint(s.endpoint), "raw_delivery": s.raw_delivery, "filter_policy": s.filter_policy,
            "confirmed": s.confirmed, "created_at": s.created_at}


def _delivery(d: types.Delivery) -> dict[str, Any]:
    return {"id": d.id, "subscription_id": d.subscription_id, "endpoint": _endpoint(d.endpoint),
            "message_id": d.message_id, "attempt": d.attempt, "max_attempts": d.max_attempts,
            "next_attempt_at": d.next_attempt_at, "last_error": d.last_error, "held_reason": d.held_reason,
            "created_at": d.created_at, "state": d.state}


async def list_topics(request: Request) -> Response:
    """Topics, every subscription (by routing-key pattern) and the webhook outbox."""
    async with _broker(request).connection() as conn:
        found = await topics.list_all(conn)
        subscriptions = await topics.subscriptions_list(conn, limit=1000)
        stats = await topics.deliveries_stats(conn)
        stuck = [*await topics.delivery_list(conn, "held", limit=50),
                 *await topics.delivery_list(conn, "exhausted", limit=50)]
        pending = await topics.delivery_list(conn, "pending", limit=50)
    return _json({"topics": [{"name": t.name, "fifo": t.fifo, "created_at": t.created_at,
                              "subscriptions": t.subscriptions} for t in found],
                  "subscriptions": [_subscription(s) for s in subscriptions],
                  "outbox": {**_row(stats), "pending_deliveries": [_delivery(d) for d in pending],
                             "stuck_deliveries": [_delivery(d) for d in stuck]}})


# -- history -----------------------------------------------------------------------------

async def series(request: Request) -> Response:
    """One thing's samples over the last ``minutes`` (``kind``: queue, stream, consumer
    as stream/consumer, pqueue, outbox as webhooks)."""
    kind, name = request.query_params.get("kind", ""), request.query_params.get("name", "")
    if kind not in history.KINDS:
        raise errors.InvalidInput(f"kind must be one of {', '.join(history.KINDS)}")
    if not 1 <= len(name) <= 300:
        raise errors.InvalidInput("name is required (1 to 300 characters)")
    minutes = _integer(request, "minutes", 60, 1, MAX_MINUTES)
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=minutes)
    async with _broker(request).connection() as conn:
        found = await history.series(conn, kind, name, since)
    return _json({"kind": kind, "name": name, "minutes": minutes, "interval": request.app.state.interval,
                  "points": [_row(s) for s in found]})


@dataclasses.dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    handler: Handler
    role: str


Q = "/queues/{name}"

ENDPOINTS = [
    Endpoint("GET", "/whoami", whoami, "read"),
    Endpoint("GET", "/queues", list_queues, "read"),
    Endpoint("GET", Q + "/messages", peek_messages, "read"),
    Endpoint("GET", Q + "/messages/{id}", message_history, "read"),
    Endpoint("GET", Q + "/redrives", list_redrives, "read"),
    Endpoint("POST", Q + "/redrives", start_redrive, "admin"),
    Endpoint("GET", "/streams", list_streams, "read"),
    Endpoint("GET", "/topics", list_topics, "read"),
    Endpoint("GET", "/history", series, "read"),
]


def app(broker: object, auth_mode: str, interval: float) -> Starlette:
    """The /ui/api sub-application."""
    # each route behind its role check: the server decides, whatever the page shows
    sub = Starlette(routes=[Route(e.path, endpoints.guarded(e.handler, e.role, render.error), methods=[e.method])
                            for e in ENDPOINTS],
                    exception_handlers={HTTPException: rest.http_error})
    sub.state.broker = broker
    sub.state.auth_mode = auth_mode
    sub.state.interval = interval
    return sub
