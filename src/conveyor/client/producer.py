"""Appending events: ``append(conn, ...)`` on the caller's connection (so the events commit
with the caller's own writes), and ``Producer``, which keeps a small pool of its own."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable
from typing import Any

import orjson

from conveyor import tracing
from conveyor.core import streams
from conveyor.db import execute, pool
from conveyor.types import StreamEventIn

Connection = execute.Connection


def _payload(payload: Any) -> str:
    """Text is stored as given; anything else is encoded as JSON."""
    return payload if isinstance(payload, str) else orjson.dumps(payload).decode()


def _event(payload: Any, type: str, extras: dict[str, str | None]) -> StreamEventIn:
    return StreamEventIn(payload=_payload(payload), type=type, traceparent=tracing.current_traceparent(), **extras)


def _events(events: Iterable[StreamEventIn | Any], type: str) -> list[StreamEventIn]:
    """Events as given, carrying the caller's current trace (conveyor.tracing) unless they
    name one of their own."""
    trace = tracing.current_traceparent()
    return [(e if e.traceparent or not trace else dataclasses.replace(e, traceparent=trace))
            if isinstance(e, StreamEventIn) else StreamEventIn(payload=_payload(e), type=type, traceparent=trace)
            for e in events]


async def append(conn: Connection, stream: str, payload: Any, *, type: str = "default",
                 extra1: str | None = None, extra2: str | None = None, extra3: str | None = None,
                 extra4: str | None = None) -> int:
    """Append one event on ``conn`` (in its transaction, if one is open); the event's id."""
    event = _event(payload, type, {"extra1": extra1, "extra2": extra2, "extra3": extra3, "extra4": extra4})
    (event_id,) = await streams.append(conn, stream, [event])
    return event_id


async def append_batch(conn: Connection, stream: str, events: Iterable[StreamEventIn | Any], *,
                       type: str = "default") -> list[int]:
    """Append events in one statement on ``conn``: ``StreamEventIn`` values, or payloads
    (given ``type``); their ids in order."""
    batch = _events(events, type)
    return await streams.append(conn, stream, batch) if batch else []


class Producer:
    """Appends events on connections of its own (autocommit: each call commits).

    ``async with Producer(dsn) as producer: await producer.append("orders", {...})``
    """

    def __init__(self, dsn: str, *, max_connections: int = 4) -> None:
        self._db = pool.Database(dsn, min_size=1, max_size=max_connections, application_name="conveyor-producer")
        self._opened = False
        self._lock = asyncio.Lock()

    async def _open(self) -> pool.Database:
        if not self._opened:
            async with self._lock:
                if not self._opened:
                    await self._db.open()
                    self._opened = True
        return self._db

    async def append(self, stream: str, payload: Any, *, type: str = "default",
                     extra1: str | None = None, extra2: str | None = None, extra3: str | None = None,
                     extra4: str | None = None) -> int:
        async with (await self._open()).connection() as conn:
            return await append(conn, stream, payload, type=type, extra1=extra1, extra2=extra2,
                                extra3=extra3, extra4=extra4)

    async def append_batch(self, stream: str, events: Iterable[StreamEventIn | Any], *,
                           type: str = "default") -> list[int]:
        batch = _events(events, type)
        if not batch:
            return []
        async with (await self._open()).connection() as conn:
            return await streams.append(conn, stream, batch)

    async def close(self) -> None:
        if self._opened:
            await self._db.close()
            self._opened = False

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
