"""The dashboard's history (migration 0012): samples of the engine's own reports (queue
metrics, stream and consumer stats, partitioned queues' lag, the webhook outbox) taken
by the server's "history" worker and kept for a bounded time, read back as series with
rates; and a queue message's history (where it is and has been)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from conveyor import types
from conveyor.db import execute as db

Connection = db.Connection

KINDS = ("queue", "stream", "consumer", "pqueue", "outbox")


@dataclass(frozen=True, slots=True)
class Sample:
    """One point of a series: the state then, and the rates since the point before
    (None for the first point, and where a counter went back)."""

    sampled_at: dt.datetime
    depth: int
    in_flight: int
    delayed: int
    oldest_age_sec: int | None
    dead_letters: int
    sent_per_sec: Decimal | None
    done_per_sec: Decimal | None


@dataclass(frozen=True, slots=True)
class Rates:
    """The latest rates of one thing (over the last samples)."""

    name: str
    sent_per_sec: Decimal | None
    done_per_sec: Decimal | None
    sampled_at: dt.datetime


async def record(conn: Connection, keep: dt.timedelta, min_gap: dt.timedelta = dt.timedelta(0)) -> int:
    """Sample everything now (unless a sample is younger than ``min_gap``: every server
    process may call this) and drop samples older than ``keep``. Rows written."""
    return await db.fetch_scalar(conn, "history_record", {"keep_seconds": keep.total_seconds(),
                                                          "min_gap_seconds": min_gap.total_seconds()}, int)


async def prune(conn: Connection, keep: dt.timedelta) -> int:
    return await db.fetch_scalar(conn, "history_prune", {"keep_seconds": keep.total_seconds()}, int)


async def latest_queues(conn: Connection, max_age: dt.timedelta) -> list[types.QueueDepth]:
    """Every queue's figures of the latest sample, if it is younger than ``max_age``."""
    return await db.fetch_all(conn, "history_latest_queues", {"max_age_seconds": max_age.total_seconds()},
                              row=types.QueueDepth)


async def series(conn: Connection, kind: str, name: str, since: dt.datetime) -> list[Sample]:
    return await db.fetch_all(conn, "history_series", {"kind": kind, "name": name, "since": since}, row=Sample)


async def rates(conn: Connection, kind: str, span: dt.timedelta = dt.timedelta(minutes=1)) -> list[Rates]:
    return await db.fetch_all(conn, "history_rates", {"kind": kind, "span_seconds": span.total_seconds()},
                              row=Rates)


async def message(conn: Connection, queue: str, message_id: int) -> dict[str, Any] | None:
    """Where a queue message is and has been (``errors.QueueNotFound`` for an unknown
    queue); None if the queue has no such message, live or archived."""
    return await db.fetch_optional(conn, "history_message", {"queue": queue, "id": message_id}, dict)
