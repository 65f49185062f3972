"""Queen's endpoint table: one row per route with the role it needs (Queen's access
levels: read-only = read, read-write = write, admin = admin), served under /api/v1."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from conveyor.protocols.endpoints import guarded
from conveyor.protocols.queen import admin, messages
from conveyor.protocols.queen import request as req

Handler = Callable[[Request], Awaitable[Response]]


@dataclasses.dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    handler: Handler
    role: str


MSG = "/messages/{partition_id}/{transaction_id}"
CG = "/consumer-groups/{group}"

ENDPOINTS = [
    # the hot path
    Endpoint("POST", "/push", messages.push, "write"),
    Endpoint("GET", "/pop/queue/{queue}/partition/{partition}", messages.pop_partition, "write"),
    Endpoint("GET", "/pop/queue/{queue}", messages.pop_queue, "write"),
    Endpoint("GET", "/pop", messages.pop_any, "write"),
    Endpoint("POST", "/ack", messages.ack, "write"),
    Endpoint("POST", "/ack/batch", messages.ack_batch, "write"),
    Endpoint("POST", "/lease/{lease_id}/extend", messages.extend_lease, "write"),
    Endpoint("POST", "/transaction", messages.transaction, "write"),
    Endpoint("POST", "/traces", messages.record_trace, "write"),
    # queues
    Endpoint("POST", "/configure", admin.configure, "admin"),
    Endpoint("GET", "/resources/queues", admin.list_queues, "read"),
    Endpoint("GET", "/resources/queues/{queue}", admin.get_queue, "read"),
    Endpoint("DELETE", "/resources/queues/{queue}", admin.delete_queue, "admin"),
    Endpoint("GET", "/resources/queues/{queue}/depth", admin.queue_depth, "read"),
    Endpoint("DELETE", "/queues/{queue}/clear", admin.clear_queue, "admin"),
    Endpoint("GET", "/resources/partitions", admin.list_partitions, "read"),
    Endpoint("GET", "/resources/overview", admin.overview, "read"),
    Endpoint("GET", "/resources/namespaces", admin.namespaces, "read"),
    Endpoint("GET", "/resources/tasks", admin.tasks, "read"),
    # status and analytics
    Endpoint("GET", "/status", admin.status, "read"),
    Endpoint("GET", "/status/queues", admin.status_queues, "read"),
    Endpoint("GET", "/status/queues/{queue}", admin.status_queue, "read"),
    Endpoint("GET", "/status/analytics", admin.analytics, "read"),
    Endpoint("GET", "/analytics/system-metrics", admin.system_metrics, "read"),
    Endpoint("GET", "/analytics/worker-metrics", admin.worker_metrics, "read"),
    Endpoint("GET", "/analytics/postgres-stats", admin.postgres_stats, "read"),
    # consumer groups
    Endpoint("GET", "/consumer-groups", admin.consumer_groups, "read"),
    Endpoint("GET", "/consumer-groups/lagging", admin.lagging, "read"),
    Endpoint("GET", CG, admin.consumer_group, "read"),
    Endpoint("DELETE", CG, admin.delete_group, "admin"),
    Endpoint("POST", CG + "/subscription", admin.update_subscription, "admin"),
    Endpoint("DELETE", CG + "/queues/{queue}", admin.delete_group_for_queue, "admin"),
    Endpoint("POST", CG + "/queues/{queue}/seek", admin.seek, "admin"),
    # dead letters, messages, traces
    Endpoint("GET", "/dlq", admin.dead_letters, "read"),
    Endpoint("GET", "/messages", admin.list_messages, "read"),
    Endpoint("GET", MSG, admin.get_message, "read"),
    Endpoint("DELETE", MSG, admin.delete_message, "admin"),
    Endpoint("POST", MSG + "/retry", admin.retry_message, "admin"),
    Endpoint("POST", MSG + "/dlq", admin.dead_letter_message, "admin"),
    Endpoint("GET", "/traces/names", admin.trace_names, "read"),
    Endpoint("GET", "/traces/by-name/{name}", admin.traces_by_name, "read"),
    Endpoint("GET", "/traces/{partition_id}/{transaction_id}", admin.message_traces, "read"),
]


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "no_such_route", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status_code, "error")
    return Response(orjson.dumps({"error": exc.detail, "code": code}), status_code=exc.status_code,
                    media_type="application/json")


def app(broker: object, create_on_push: messages.CreateOnPush | None = None) -> Starlette:
    """The /api/v1 sub-application."""
    sub = Starlette(routes=[Route(e.path, guarded(e.handler, e.role, req.error), methods=[e.method]) for e in ENDPOINTS],
                    exception_handlers={HTTPException: _http_error})
    sub.state.broker = broker
    sub.state.create_on_push = create_on_push or messages.CreateOnPush()
    return sub
