"""Stream operations: create and configure streams, append, subscribe, receive batches,
acknowledge, retry, dead letters, and the ticker and maintenance that drive them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from conveyor import types
from conveyor.db import execute as db

Connection = db.Connection
TICKER_LOCK_KEY = 7306554612  # pg_try_advisory_lock key: one active ticker per database


async def create(conn: Connection, name: str, options: Mapping[str, Any] | None = None) -> types.Stream:
    return await db.fetch_row(conn, "stream_create", {"name": name, "options": dict(options or {})},
                              row=types.Stream)


async def drop(conn: Connection, name: str) -> bool:
    return bool(await db.fetch_value(conn, "stream_drop", {"name": name}))


async def get(conn: Connection, name: str) -> types.Stream:
    return await db.fetch_row(conn, "stream_get", {"name": name}, row=types.Stream)


async def list_all(conn: Connection) -> list[types.Stream]:
    return await db.fetch_all(conn, "stream_list", row=types.Stream)


async def configure(conn: Connection, name: str, options: Mapping[str, Any]) -> types.Stream:
    """Change options (rotation_period, ticker_*, max_retries, event_ttl, ticker_paused)."""
    return await db.fetch_row(conn, "stream_set_config", {"name": name, "options": dict(options)},
                              row=types.Stream)


async def append(conn: Connection, name: str, events: Sequence[types.StreamEventIn]) -> list[int]:
    """Append events in one statement; their ids in input order."""
    payload = orjson.dumps([e.to_json() for e in events]).decode()
    return [int(i) for i in await db.fetch_column(conn, "stream_send_json", {"name": name, "events": payload})]


async def append_at(conn: Connection, name: str, event: types.StreamEventIn, deliver_at: dt.datetime) -> int:
    """Deliver later; the id of the scheduled entry (or of the event, if due now)."""
    return int(await db.fetch_value(conn, "stream_send_at", {
        "name": name, "payload": event.payload, "deliver_at": deliver_at, "type": event.type,
        "extra1": event.extra1, "extra2": event.extra2, "extra3": event.extra3, "extra4": event.extra4,
        "traceparent": event.traceparent}))


async def subscribe(conn: Connection, name: str, consumer: str) -> bool:
    return bool(await db.fetch_value(conn, "stream_subscribe", {"name": name, "consumer": consumer}))


async def unsubscribe(conn: Connection, name: str, consumer: str) -> bool:
    return bool(await db.fetch_value(conn, "stream_unsubscribe", {"name": name, "consumer": consumer}))


async def receive(conn: Connection, name: str, consumer: str, max_events: int = 1000,
                  after: int | None = None) -> list[types.StreamEvent]:
    """The consumer's next batch (empty if there is none yet), ``max_events`` at a time: the
    first page, or with ``after`` the events of the open batch after that id. ``ack``
    refuses a batch until its last page has been received."""
    return await db.fetch_all(conn, "stream_receive", {"name": name, "consumer": consumer, "max": max_events,
                                                       "after": after}, row=types.StreamEvent)


async def batch_read_all(conn: Connection, batch_id: int) -> bool | None:
    """Whether ``receive`` has handed out the batch's last event (None: not read that way)."""
    return await db.fetch_optional(conn, "stream_batch_read_all", {"batch_id": batch_id}, bool)


async def next_batch(conn: Connection, name: str, consumer: str, *, min_lag: dt.timedelta | None = None,
                     min_count: int | None = None, min_interval: dt.timedelta | None = None) -> int | None:
    return await db.fetch_optional(conn, "stream_next_batch", {
        "name": name, "consumer": consumer, "min_lag": min_lag, "min_count": min_count,
        "min_interval": min_interval}, int)


async def batch_events(conn: Connection, batch_id: int) -> list[types.StreamEvent]:
    return await db.fetch_all(conn, "stream_get_batch_events", {"batch_id": batch_id}, row=types.StreamEvent)


async def ack(conn: Connection, batch_id: int) -> None:
    await db.fetch_value(conn, "stream_ack", {"batch_id": batch_id})


async def nack(conn: Connection, batch_id: int, event_id: int, retry_after: dt.timedelta = dt.timedelta(seconds=60),
               reason: str | None = None) -> str:
    """Retry the event later for this consumer, or dead-letter it past max_retries:
    returns "retry" or "dead"."""
    return await db.fetch_scalar(conn, "stream_nack", {"batch_id": batch_id, "event_id": event_id,
                                                       "retry_after": retry_after, "reason": reason}, str)


async def dead_letter(conn: Connection, batch_id: int, event_id: int, reason: str | None = None) -> None:
    await db.fetch_value(conn, "stream_dead_letter", {"batch_id": batch_id, "event_id": event_id, "reason": reason})


async def event_retry(conn: Connection, batch_id: int, event_id: int, retry_seconds: int) -> None:
    await db.fetch_value(conn, "stream_event_retry", {"batch_id": batch_id, "event_id": event_id,
                                                      "retry_seconds": retry_seconds})


async def batch_retry(conn: Connection, batch_id: int, retry_seconds: int) -> int:
    return int(await db.fetch_value(conn, "stream_batch_retry", {"batch_id": batch_id,
                                                                 "retry_seconds": retry_seconds}))


async def dead_letters(conn: Connection, name: str, max_rows: int = 100) -> list[types.StreamDeadLetter]:
    return await db.fetch_all(conn, "stream_dead_letters", {"name": name, "max": max_rows},
                              row=types.StreamDeadLetter)


async def replay_dead_letter(conn: Connection, dead_letter_id: int, stream: str | None = None) -> int:
    """Put a dead letter back into its stream (which must be ``stream`` when given);
    DeadLetterNotFound if there is no such dead letter."""
    return int(await db.fetch_value(conn, "stream_dead_letter_replay", {"id": dead_letter_id, "name": stream}))


async def stream_of_batch(conn: Connection, batch_id: int) -> str | None:
    """The stream an open batch belongs to, None if no consumer holds it."""
    return await db.fetch_optional(conn, "stream_of_batch", {"batch_id": batch_id}, str)


async def replay_dead_letters(conn: Connection, name: str) -> int:
    return int(await db.fetch_value(conn, "stream_dead_letter_replay_all", {"name": name}))


async def purge_dead_letters(conn: Connection, name: str, older_than: dt.timedelta) -> int:
    return int(await db.fetch_value(conn, "stream_dead_letter_purge", {"name": name, "older_than": older_than}))


async def ticker(conn: Connection) -> int:
    """Tick every stream that needs it; how many ticks were made."""
    return int(await db.fetch_value(conn, "stream_ticker"))


async def force_tick(conn: Connection, name: str) -> int:
    return int(await db.fetch_value(conn, "stream_force_tick", {"name": name}))


async def maint(conn: Connection) -> list[tuple[str, str, int]]:
    """One maintenance round: (stream, operation, count) for what it did."""
    return [(s, op, int(n)) for s, op, n in await db.fetch_all(conn, "stream_maint")]


async def stats(conn: Connection) -> list[types.StreamStats]:
    return await db.fetch_all(conn, "stream_stats", row=types.StreamStats)


async def consumer_stats(conn: Connection) -> list[types.ConsumerStats]:
    return await db.fetch_all(conn, "stream_consumer_stats", row=types.ConsumerStats)


async def health(conn: Connection) -> list[tuple[str, str, str, str]]:
    return [tuple(r) for r in await db.fetch_all(conn, "stream_health")]


async def take_ticker_lock(conn: Connection) -> bool:
    """On a connection held for as long as this process ticks: whether it is the ticker."""
    return bool(await db.fetch_value(conn, "lock_try_advisory", {"key": TICKER_LOCK_KEY}))
