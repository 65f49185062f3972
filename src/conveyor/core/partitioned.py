"""Partitioned queues (seed 004's model): push, pop under a lease per (partition,
consumer group), acknowledge, renew, transactions, consumer groups and dead letters.

The batch operations take and return JSON documents (lists of items, acks, leases), as
the SQL functions of migration 0009 do, so that many requests fuse into one call. Field
names are Queen's (``transactionId``, ``partitionId``, ``leaseId``, ...), since its HTTP
API is their main user; docs/queen.md describes them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from conveyor import types
from conveyor.db import execute as db

Connection = db.Connection
Json = dict[str, Any]


async def configure(conn: Connection, name: str, options: Mapping[str, Any] | None = None, *,
                    namespace: str | None = None, task: str | None = None) -> types.PartitionedQueue:
    """Create a queue, or change the options given (Queen's names: leaseTime, retryLimit,
    priority, delayedProcessing, windowBuffer, maxWaitTimeSeconds, retentionSeconds,
    completedRetentionSeconds, encryptionEnabled, dlqAfterMaxRetries, ...)."""
    return await db.fetch_row(conn, "pqueue_configure", {"name": name, "options": db.jsonb(dict(options or {})),
                                                         "namespace": namespace, "task": task},
                              row=types.PartitionedQueue)


async def get(conn: Connection, name: str) -> types.PartitionedQueue | None:
    return await db.fetch_one(conn, "pqueue_get", {"name": name}, row=types.PartitionedQueue)


async def get_many(conn: Connection, names: Sequence[str]) -> list[types.PartitionedQueue]:
    """Those of the named queues that exist."""
    return await db.fetch_all(conn, "pqueue_get_many", {"names": list(names)}, row=types.PartitionedQueue)


async def list_all(conn: Connection) -> list[types.PartitionedQueue]:
    return await db.fetch_all(conn, "pqueue_list", row=types.PartitionedQueue)


async def drop(conn: Connection, name: str) -> bool:
    return bool(await db.fetch_value(conn, "pqueue_drop", {"name": name}))


async def listen(conn: Connection, name: str, seconds: int) -> None:
    """Make pushes to the queue NOTIFY for ``seconds`` (long pollers wait)."""
    await db.fetch_value(conn, "pqueue_listen", {"name": name, "seconds": seconds})


async def push(conn: Connection, items: Sequence[Json]) -> list[Json]:
    """Push items ``{queue, partition?, payload, transactionId?, traceId?, producerSub?,
    encrypted?}``; one answer per item (``status`` queued or duplicate). Queues it names
    that do not exist are created (bound that first with ``create_missing``)."""
    return await db.fetch_scalar(conn, "pqueue_push", {"items": db.jsonb(list(items))}, list)


async def create_missing(conn: Connection, names: Sequence[str], *, max_new: int | None = None,
                         max_total: int | None = None) -> list[str]:
    """Create those of ``names`` that do not exist, at most ``max_new`` of them and none
    beyond ``max_total`` partitioned queues in all (None: no bound); beyond either,
    nothing is created (``errors.QueueLimitReached``). Returns the names created."""
    return await db.fetch_scalar(conn, "pqueue_create_missing",
                                 {"names": list(names), "max_new": max_new, "max_total": max_total}, list)


async def pop(conn: Connection, request: Json) -> Json:
    """One pop: ``{queue | namespace/task, partition?, consumerGroup?, batch, maxPartitions?,
    leaseSeconds?, workerId?}`` -> ``{messages, leaseId}``."""
    return await db.fetch_scalar(conn, "pqueue_pop", {"request": db.jsonb(dict(request))}, dict)


async def pop_many(conn: Connection, requests: Sequence[Json], *, lazy: bool = False) -> list[Json]:
    """Several pops in one call (fusion); one answer each, in order. ``lazy``: the call is
    its own transaction (``conn`` in autocommit), whose pops that only lease commit without
    waiting for the WAL flush (``conveyor.pqueue_pop_many``; docs/architecture.md,
    "Durability of a pop")."""
    return await db.fetch_scalar(conn, "pqueue_pop_many", {"requests": db.jsonb(list(requests)), "lazy": lazy}, list)


async def ack(conn: Connection, acks: Sequence[Json], *, strict: bool = False) -> list[Json]:
    """Acknowledge ``{transactionId, partitionId, leaseId?, status, error?, consumerGroup?}``
    each; one answer per ack. An ack acts under the lease it names; one naming none is
    refused while another holds a live lease on its partition for its group. ``strict``
    raises on the first refused one instead."""
    return await db.fetch_scalar(conn, "pqueue_ack", {"acks": db.jsonb(list(acks)), "strict": strict}, list)


async def renew(conn: Connection, leases: Sequence[Json]) -> list[Json]:
    """Extend leases ``{leaseId, seconds?}``; ``expiresAt`` None for a lease no longer held."""
    return await db.fetch_scalar(conn, "pqueue_renew", {"leases": db.jsonb(list(leases))}, list)


async def transaction(conn: Connection, operations: Sequence[Json], required_leases: Sequence[str] = ()) -> Json:
    """Acks and pushes, all or nothing (``errors.LeaseNotHeld`` if an ack's lease is gone,
    or one of ``required_leases`` is no longer held; acks naming no lease act under the
    required lease of their partition)."""
    return await db.fetch_scalar(conn, "pqueue_transaction", {
        "operations": db.jsonb(list(operations)),
        "required_leases": db.jsonb(list(required_leases)) if required_leases else None}, dict)


async def subscribe(conn: Connection, queue: str, group: str, mode: str = "all",
                    start_at: dt.datetime | None = None) -> types.ConsumerGroup:
    return await db.fetch_row(conn, "pqueue_subscribe", {"queue": queue, "group": group, "mode": mode,
                                                         "start_at": start_at}, row=types.ConsumerGroup)


async def seek(conn: Connection, queue: str, group: str, at: dt.datetime | None) -> int:
    """Move a group to ``at`` in every partition: messages from then on come again
    (None: to the end, nothing comes again)."""
    return await db.fetch_scalar(conn, "pqueue_seek", {"queue": queue, "group": group, "at": at}, int)


async def delete_group(conn: Connection, group: str, queue: str | None = None) -> int:
    return await db.fetch_scalar(conn, "pqueue_group_delete", {"group": group, "queue": queue}, int)


async def group_lag(conn: Connection, queue: str | None = None, group: str | None = None) -> list[types.ConsumerGroupLag]:
    return await db.fetch_all(conn, "pqueue_group_lag", {"queue": queue, "group": group},
                              row=types.ConsumerGroupLag)


async def retry_dead_letters(conn: Connection, ids: Sequence[int]) -> int:
    return await db.fetch_scalar(conn, "pqueue_dead_letter_retry", {"ids": list(ids)}, int)


async def maintain(conn: Connection) -> int:
    return await db.fetch_scalar(conn, "pqueue_maintain", None, int)


async def clear(conn: Connection, queue: str, partition: str | None = None) -> int:
    return await db.fetch_scalar(conn, "pqueue_clear", {"queue": queue, "partition": partition}, int)


async def trace(conn: Connection, data: Json) -> int | None:
    """Record a trace event about a message; None if the message does not exist."""
    return await db.fetch_optional(conn, "pqueue_trace", {"data": db.jsonb(dict(data))}, int)


async def delete_message(conn: Connection, partition_id: str, transaction_id: str) -> bool:
    return await db.fetch_scalar(conn, "pqueue_message_delete",
                                 {"partition_id": partition_id, "transaction_id": transaction_id}, bool)


async def dead_letter_message(conn: Connection, partition_id: str, transaction_id: str,
                              group: str | None = None, error: str | None = None) -> bool:
    return await db.fetch_scalar(conn, "pqueue_message_dead_letter", {
        "partition_id": partition_id, "transaction_id": transaction_id, "group": group, "error": error}, bool)


async def dead_letter_ids(conn: Connection, partition_id: str, transaction_id: str) -> list[int]:
    return await db.fetch_column(conn, "pqueue_dead_letter_ids",
                                 {"partition_id": partition_id, "transaction_id": transaction_id})


# -- reports: one JSON document each (Queen's admin API, the dashboard) ------------------

REPORTS = ("pqueue_message_get", "pqueue_message_list", "pqueue_dead_letter_list", "pqueue_trace_list",
           "pqueue_trace_by_name", "pqueue_trace_names", "pqueue_queue_summaries", "pqueue_partition_list",
           "pqueue_depth", "pqueue_overview", "pqueue_namespaces", "pqueue_tasks", "pqueue_throughput",
           "pqueue_lagging", "pqueue_postgres_stats")


async def report(conn: Connection, name: str, params: Mapping[str, Any] | None = None) -> Any:
    """One of ``REPORTS`` with its parameters; None when it finds nothing (a message or
    queue that does not exist)."""
    if name not in REPORTS:
        raise ValueError(f"unknown report {name!r}")
    return await db.fetch_value(conn, name, params)
