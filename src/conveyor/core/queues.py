"""Queue operations: create, alter, drop, inspect, purge, metrics, maintenance."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from conveyor import errors, types
from conveyor.db import execute as db

Connection = db.Connection


async def create(conn: Connection, name: str, attributes: Mapping[str, Any] | None = None) -> types.Queue:
    """Create a queue, or return it if it exists with every given attribute equal."""
    return await db.fetch_row(conn, "queue_create", {"name": name, "attributes": dict(attributes or {})},
                              row=types.Queue)


async def alter(conn: Connection, name: str, attributes: Mapping[str, Any]) -> types.Queue:
    return await db.fetch_row(conn, "queue_alter", {"name": name, "attributes": dict(attributes)},
                              row=types.Queue)


async def drop(conn: Connection, name: str) -> bool:
    return bool(await db.fetch_value(conn, "queue_drop", {"name": name}))


async def get(conn: Connection, name: str) -> types.Queue:
    return await db.fetch_row(conn, "queue_get", {"name": name}, row=types.Queue)


async def list_all(conn: Connection, prefix: str | None = None) -> list[types.Queue]:
    return await db.fetch_all(conn, "queue_list", {"prefix": prefix}, row=types.Queue)


async def purge(conn: Connection, name: str) -> int:
    return int(await db.fetch_value(conn, "queue_purge", {"name": name}))


async def tag(conn: Connection, name: str, tags: Mapping[str, str | None]) -> dict[str, str]:
    """Add or change tags (a None value removes the tag); returns all tags."""
    return await db.fetch_scalar(conn, "queue_tag", {"name": name, "tags": dict(tags)}, dict)


async def untag(conn: Connection, name: str, keys: list[str]) -> dict[str, str]:
    return await db.fetch_scalar(conn, "queue_untag", {"name": name, "keys": keys}, dict)


async def listen(conn: Connection, name: str, seconds: int) -> datetime:
    """Ask senders to NOTIFY about this queue for the next ``seconds``."""
    return await db.fetch_scalar(conn, "queue_listen", {"name": name, "seconds": seconds}, datetime)


async def storage(conn: Connection, name: str) -> list[types.QueueTable]:
    """The tables holding the queue's messages and archive (its partitions, if any)."""
    return await db.fetch_all(conn, "queue_storage", {"name": name}, row=types.QueueTable)


async def metrics(conn: Connection, name: str) -> types.QueueMetrics:
    row = await db.fetch_one(conn, "queue_metrics", {"name": name}, row=types.QueueMetrics)
    if row is None:
        raise errors.QueueNotFound(f"queue {name!r} does not exist")
    return row


async def metrics_all(conn: Connection) -> list[types.QueueMetrics]:
    return await db.fetch_all(conn, "queue_metrics_all", row=types.QueueMetrics)


async def maintenance(conn: Connection, max_rows: int = 10000) -> dict[str, int]:
    """One bounded round of retention clean-up; returns rows removed per task."""
    rows = await db.fetch_all(conn, "queue_maintenance", {"max_rows": max_rows})
    return {task: int(n) for task, n in rows}
