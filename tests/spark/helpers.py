"""Setting up queues and streams with plain SQL (as a psql user would) for the Spark tests."""

from __future__ import annotations

import json
from typing import Any

import psycopg


def sql(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params or None)
        return cur.fetchall() if cur.description else []


def value(dsn: str, query: str, *params: Any) -> Any:
    rows = sql(dsn, query, *params)
    return rows[0][0] if rows else None


def append(dsn: str, stream: str, payloads: list[str], type_: str = "default") -> list[int]:
    return [r[0] for r in sql(dsn, "SELECT conveyor.stream_send_batch(%s, %s, %s::text[])", stream, type_, payloads)]


def tick(dsn: str, stream: str) -> int:
    return int(value(dsn, "SELECT conveyor.stream_force_tick(%s)", stream))


def push(dsn: str, queue: str, partition: str, payloads: list[Any], **fields: Any) -> list[int]:
    """Pushes to a partitioned queue (created with its partition if need be); the positions
    (seq) the messages got."""
    items = [{"queue": queue, "partition": partition, "payload": p, **fields} for p in payloads]
    answers = value(dsn, "SELECT conveyor.pqueue_push(%s::jsonb)", json.dumps(items))
    return [a["seq"] for a in answers]
