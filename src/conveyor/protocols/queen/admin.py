"""Queen's administration API: queue configuration, resources, status and analytics,
consumer groups, dead letters, message lookup and traces."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from conveyor import errors
from conveyor.core import partitioned
from conveyor.protocols.queen import request as req


async def _report(request: Request, name: str, params: dict[str, Any] | None = None) -> Any:
    async with req.broker(request).connection() as conn:
        return await partitioned.report(conn, name, params)


def _page(request: Request, default: int = 100) -> dict[str, int]:
    return {"limit": req.integer(request, "limit", default, 1, req.MAX_PAGE),
            "offset": req.integer(request, "offset", 0, 0, 10**9)}


# -- queues ------------------------------------------------------------------------------

async def configure(request: Request) -> Response:
    data = await req.body_object(request)
    name = data.get("queue")
    if not isinstance(name, str) or not name:
        raise errors.InvalidInput("queue is required")
    options = data.get("options") or {}
    if not isinstance(options, dict):
        raise errors.InvalidInput("options must be a JSON object")
    namespace, task = data.get("namespace"), data.get("task")
    for key, value in (("namespace", namespace), ("task", task)):
        if value is not None and not isinstance(value, str):
            raise errors.InvalidInput(f"{key} must be a string")
    if options.get("encryptionEnabled") in (True, "true") and not req.broker(request).can_encrypt():
        raise errors.InvalidInput("encryptionEnabled needs the server's encryption key (CONVEYOR_ENCRYPTION_KEY), "
                                  "which this server does not have")
    async with req.broker(request).connection() as conn:
        q = await partitioned.configure(conn, name, options, namespace=namespace, task=task)
    return req.json({"configured": True, "queue": q.name, "namespace": q.namespace, "task": q.task,
                     "options": {"leaseTime": q.lease_time, "retryLimit": q.retry_limit, "priority": q.priority,
                                 "delayedProcessing": q.delayed_processing, "windowBuffer": q.window_buffer,
                                 "maxWaitTimeSeconds": q.max_wait_time_seconds,
                                 "retentionSeconds": q.retention_seconds,
                                 "completedRetentionSeconds": q.completed_retention_seconds,
                                 "encryptionEnabled": q.encryption_enabled,
                                 "dlqAfterMaxRetries": q.dlq_after_max_retries}})


async def delete_queue(request: Request) -> Response:
    name = request.path_params["queue"]
    async with req.broker(request).connection() as conn:
        deleted = await partitioned.drop(conn, name)
    if not deleted:
        raise errors.PartitionedQueueNotFound(f"queue {name[:100]!r} does not exist")
    return req.json({"deleted": True, "queue": name})


async def clear_queue(request: Request) -> Response:
    name = request.path_params["queue"]
    async with req.broker(request).connection() as conn:
        removed = await partitioned.clear(conn, name, req.text(request, "partition"))
    return req.json({"success": True, "queue": name, "deleted": removed})


async def list_queues(request: Request) -> Response:
    found = await _report(request, "pqueue_queue_summaries", {
        "name": None, "namespace": req.text(request, "namespace"), "task": req.text(request, "task")})
    page = _page(request)
    return req.json({"queues": found[page["offset"]:page["offset"] + page["limit"]], "total": len(found), **page})


async def get_queue(request: Request) -> Response:
    name = request.path_params["queue"]
    found = await _report(request, "pqueue_queue_summaries", {"name": name, "namespace": None, "task": None})
    if not found:
        raise errors.PartitionedQueueNotFound(f"queue {name[:100]!r} does not exist")
    detail = found[0]
    detail["partitionDetails"] = await _report(request, "pqueue_partition_list",
                                               {"queue": name, "limit": req.MAX_PAGE, "offset": 0})
    async with req.broker(request).connection() as conn:
        detail["consumerGroupDetails"] = [_lag(g) for g in await partitioned.group_lag(conn, name)]
    return req.json(detail)


async def queue_depth(request: Request) -> Response:
    found = await _report(request, "pqueue_depth", {"queue": request.path_params["queue"],
                                                    "group": req.text(request, "group")})
    if found is None:
        raise errors.PartitionedQueueNotFound(f"queue {request.path_params['queue'][:100]!r} does not exist")
    return req.json(found)


async def list_partitions(request: Request) -> Response:
    return req.json({"partitions": await _report(request, "pqueue_partition_list",
                                                 {"queue": req.text(request, "queue"), **_page(request)})})


async def overview(request: Request) -> Response:
    return req.json(await _report(request, "pqueue_overview"))


async def namespaces(request: Request) -> Response:
    return req.json({"namespaces": await _report(request, "pqueue_namespaces")})


async def tasks(request: Request) -> Response:
    return req.json({"tasks": await _report(request, "pqueue_tasks")})


# -- status and analytics ----------------------------------------------------------------

def _window(request: Request) -> tuple[dt.datetime, dt.datetime]:
    now = dt.datetime.now(dt.UTC)
    to = req.instant(request.query_params.get("to"), "to") or now
    start = req.instant(request.query_params.get("from"), "from") or to - dt.timedelta(hours=1)
    if start >= to:
        raise errors.InvalidInput("from must be before to")
    if to - start > dt.timedelta(days=31):
        raise errors.InvalidInput("the window is at most 31 days")
    return start, to


async def status(request: Request) -> Response:
    start, to = _window(request)
    queue = req.text(request, "queue")
    return req.json({
        "window": {"from": start.isoformat(), "to": to.isoformat()},
        "overview": await _report(request, "pqueue_overview"),
        "throughput": await _report(request, "pqueue_throughput", {"from": start, "to": to, "queue": queue}),
        "queues": await _report(request, "pqueue_queue_summaries", {"name": queue, "namespace": None, "task": None}),
    })


async def status_queues(request: Request) -> Response:
    return req.json({"queues": await _report(request, "pqueue_queue_summaries", {
        "name": None, "namespace": req.text(request, "namespace"), "task": req.text(request, "task")})})


async def status_queue(request: Request) -> Response:
    return await get_queue(request)


async def analytics(request: Request) -> Response:
    start, to = _window(request)
    series = await _report(request, "pqueue_throughput", {"from": start, "to": to, "queue": req.text(request, "queue")})
    return req.json({"window": {"from": start.isoformat(), "to": to.isoformat()}, "throughput": series,
                     "totals": {"pushed": sum(p["pushed"] for p in series),
                                "deadLettered": sum(p["deadLettered"] for p in series)}})


def _process() -> dict[str, Any]:
    """This server process: pid and memory (Linux /proc; empty elsewhere)."""
    found: dict[str, Any] = {"pid": os.getpid()}
    with contextlib.suppress(OSError), open("/proc/self/status", encoding="ascii", errors="replace") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Threads"):
                found[key] = value.strip()
    return found


async def system_metrics(request: Request) -> Response:
    return req.json({"process": _process(), "overview": await _report(request, "pqueue_overview")})


async def worker_metrics(request: Request) -> Response:
    return req.json({"workers": [_process()]})


async def postgres_stats(request: Request) -> Response:
    return req.json(await _report(request, "pqueue_postgres_stats"))


# -- consumer groups ---------------------------------------------------------------------

def _lag(g: Any) -> dict[str, Any]:
    lag_seconds = None
    if g.oldest_pending_at is not None:
        lag_seconds = max(0, int((dt.datetime.now(dt.UTC) - g.oldest_pending_at).total_seconds()))
    return {"name": g.consumer_group, "queueName": g.queue, "topics": [g.queue], "subscriptionMode": g.mode,
            "subscriptionTimestamp": g.start_at.isoformat() if g.start_at else None,
            "totalLag": g.lag, "partitionsWithLag": g.partitions_behind, "members": g.leases,
            "maxTimeLag": lag_seconds, "state": "Stable" if g.lag == 0 else "Lagging",
            "lastConsumedAt": g.last_consumed_at.isoformat() if g.last_consumed_at else None,
            "subscriptionCreatedAt": g.created_at.isoformat()}


async def consumer_groups(request: Request) -> Response:
    async with req.broker(request).connection() as conn:
        return req.json([_lag(g) for g in await partitioned.group_lag(conn)])


async def consumer_group(request: Request) -> Response:
    name = request.path_params["group"]
    async with req.broker(request).connection() as conn:
        found = [_lag(g) for g in await partitioned.group_lag(conn, group=name)]
    if not found:
        raise errors.NotFound(f"consumer group {name[:100]!r} does not exist")
    return req.json({"name": name, "queues": found})


async def lagging(request: Request) -> Response:
    return req.json(await _report(request, "pqueue_lagging", {
        "min_lag_seconds": req.integer(request, "minLagSeconds", 0, 0, 10**9)}))


async def delete_group(request: Request) -> Response:
    name = request.path_params["group"]
    async with req.broker(request).connection() as conn:
        removed = await partitioned.delete_group(conn, name)
    return req.json({"success": True, "consumerGroup": name, "deletedQueues": removed,
                     "metadataDeleted": req.flag(request, "deleteMetadata", True)})


async def delete_group_for_queue(request: Request) -> Response:
    name, queue = request.path_params["group"], request.path_params["queue"]
    async with req.broker(request).connection() as conn:
        removed = await partitioned.delete_group(conn, name, queue)
    return req.json({"success": True, "consumerGroup": name, "queueName": queue, "deletedQueues": removed,
                     "metadataDeleted": req.flag(request, "deleteMetadata", True)})


async def update_subscription(request: Request) -> Response:
    """Move a group, on every queue it reads, to a new start (replay from there)."""
    name = request.path_params["group"]
    data = await req.body_object(request)
    at = req.instant(data.get("subscriptionTimestamp"), "subscriptionTimestamp")
    if at is None:
        raise errors.InvalidInput("subscriptionTimestamp is required")
    moved = 0
    async with req.broker(request).connection() as conn:
        for g in await partitioned.group_lag(conn, group=name):
            moved += await partitioned.seek(conn, g.queue, name, at)
    return req.json({"success": True, "consumerGroup": name, "newTimestamp": at.isoformat(), "rowsUpdated": moved})


async def seek(request: Request) -> Response:
    name, queue = request.path_params["group"], request.path_params["queue"]
    data = await req.body_object(request)
    to_end = data.get("toEnd") is True
    at = req.instant(data.get("timestamp"), "timestamp")
    if not to_end and at is None:
        raise errors.InvalidInput("Must specify either toEnd=true or a timestamp")
    async with req.broker(request).connection() as conn:
        moved = await partitioned.seek(conn, queue, name, None if to_end else at)
    return req.json({"success": True, "consumerGroup": name, "queueName": queue, "seekToEnd": to_end,
                     "targetTimestamp": at.isoformat() if at else None, "partitionsUpdated": moved})


# -- dead letters, messages, traces ------------------------------------------------------

async def dead_letters(request: Request) -> Response:
    found = await _report(request, "pqueue_dead_letter_list", {
        "queue": req.text(request, "queue"), "group": req.text(request, "consumerGroup"),
        "from": req.instant(request.query_params.get("from"), "from"),
        "to": req.instant(request.query_params.get("to"), "to"), **_page(request)})
    return req.json({**found, "messages": req.broker(request).pq_opened(found.get("messages") or [])})


async def list_messages(request: Request) -> Response:
    return req.json(await _report(request, "pqueue_message_list", {
        "queue": req.text(request, "queue"), "partition": req.text(request, "partition"), **_page(request)}))


def _message_key(request: Request) -> dict[str, str]:
    return {"partition_id": req.partition_id(request.path_params["partition_id"]),
            "transaction_id": request.path_params["transaction_id"]}


async def get_message(request: Request) -> Response:
    found = await _report(request, "pqueue_message_get", _message_key(request))
    if found is None:
        raise errors.PartitionMessageNotFound("Message not found")
    [opened] = req.broker(request).pq_opened([found])
    return req.json(opened)


async def delete_message(request: Request) -> Response:
    key = _message_key(request)
    async with req.broker(request).connection() as conn:
        deleted = await partitioned.delete_message(conn, key["partition_id"], key["transaction_id"])
    if not deleted:
        raise errors.PartitionMessageNotFound("Message not found")
    return req.json({"success": True, "partitionId": key["partition_id"], "transactionId": key["transaction_id"],
                     "message": "Message deleted successfully"})


async def retry_message(request: Request) -> Response:
    """Push a dead letter of the message back (as a new message of its partition)."""
    key = _message_key(request)
    async with req.broker(request).connection() as conn:
        ids = await partitioned.dead_letter_ids(conn, key["partition_id"], key["transaction_id"])
        if not ids:
            raise errors.PartitionMessageNotFound("Message not found in the dead letters")
        retried = await partitioned.retry_dead_letters(conn, ids)
    return req.json({"success": True, "retried": retried, **key})


async def dead_letter_message(request: Request) -> Response:
    key = _message_key(request)
    data = await req.body_object(request, required=False)
    group = data.get("consumerGroup") if isinstance(data.get("consumerGroup"), str) else None
    async with req.broker(request).connection() as conn:
        moved = await partitioned.dead_letter_message(conn, key["partition_id"], key["transaction_id"], group)
    if not moved:
        raise errors.PartitionMessageNotFound("Message not found, or already done for that group")
    return req.json({"success": True, **key})


async def message_traces(request: Request) -> Response:
    return req.json(await _report(request, "pqueue_trace_list", _message_key(request)))


async def traces_by_name(request: Request) -> Response:
    return req.json(await _report(request, "pqueue_trace_by_name",
                                  {"name": request.path_params["name"], **_page(request)}))


async def trace_names(request: Request) -> Response:
    return req.json(await _report(request, "pqueue_trace_names", _page(request)))
