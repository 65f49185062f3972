"""The stream broker's long poll (server/brokers/streams.py), in process, against a real
database and the waiter hub's LISTEN connection."""

from __future__ import annotations

import asyncio
import time

from conveyor.core import streams
from conveyor.db import pool
from conveyor.server.brokers.streams import StreamBroker
from conveyor.server.metrics import Metrics
from conveyor.server.waiters import STREAM_CHANNEL, WaiterHub
from conveyor.settings import Settings


async def test_a_tick_between_the_first_look_and_the_wait_is_not_missed(dsn, conn):
    """A long poll looks for a batch once, then registers its waiter and sleeps until a
    tick's notification. A tick whose notification came between the look and the
    registration woke nobody: the poll slept on, a batch ready, until the hub's fallback
    poll (1 s by default) or the end of its wait. Here the tick is made, and its
    notification heard by the hub, right after the first look; with the hub's fallback
    poll out of reach, only a look after the registration answers before the wait ends."""
    await streams.create(conn, "ticks")
    await streams.subscribe(conn, "ticks", "reader")

    async def not_used(_queue: str, _seconds: int) -> None:
        raise AssertionError("streams are not marked")

    hub = WaiterHub(dsn, not_used, poll_fallback=3600)
    heard = asyncio.Event()
    on_notification = hub._on_notification

    def hearing(channel: str, payload: str) -> None:
        on_notification(channel, payload)
        if channel == STREAM_CHANNEL and payload == "ticks":
            heard.set()

    hub._on_notification = hearing  # type: ignore[method-assign]
    database = pool.Database(dsn, min_size=1, max_size=2)
    await database.open(wait=True)
    await hub.start()
    broker = StreamBroker(Settings(), database, Metrics(), hub)
    first_look = broker._stream_receive_once
    looks = 0

    async def look(*args):
        nonlocal looks
        looks += 1
        got = await first_look(*args)
        if looks == 1:
            assert got == []
            await conn.execute("SELECT conveyor.stream_send('ticks', 'hello')")
            assert await streams.force_tick(conn, "ticks")
            await asyncio.wait_for(heard.wait(), 10)
        return got

    broker._stream_receive_once = look  # type: ignore[method-assign]
    try:
        started = time.monotonic()
        got = await broker.stream_receive("ticks", "reader", 10, wait=20)
        assert [e.payload for e in got] == ["hello"]
        assert time.monotonic() - started < 10, "answered at the end of the wait, not when the batch was ready"
    finally:
        await hub.stop()
        await database.close()
