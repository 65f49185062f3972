"""Every tick is announced twice: on conveyor_stream (payload: the stream's name, for
servers watching all streams) and on the stream's own channel (payload: the tick id)."""

from __future__ import annotations

import asyncio

from conveyor.core import streams
from conveyor.db import listen, pool


async def _collect(dsn: str, channels: list[str], into: list[tuple[str, str]], ready: asyncio.Event) -> None:
    async def listening() -> None:
        ready.set()

    async for note in listen.notifications(dsn, channels, on_listening=listening):
        into.append(note)


async def test_a_tick_notifies_the_shared_and_the_stream_channel(dsn):
    async with pool.connect(dsn) as conn:
        orders = await streams.create(conn, "orders")
        other = await streams.create(conn, "other")
        assert orders.channel != other.channel
        assert orders.channel.startswith("conveyor_stream_")
        got: list[tuple[str, str]] = []
        ready = asyncio.Event()
        task = asyncio.create_task(_collect(dsn, ["conveyor_stream", orders.channel], got, ready))
        try:
            await asyncio.wait_for(ready.wait(), 10)
            tick = await streams.force_tick(conn, "orders")
            await streams.force_tick(conn, "other")  # its own channel is not listened to
            for _ in range(100):
                if len(got) >= 3:
                    break
                await asyncio.sleep(0.02)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert sorted(got) == sorted([("conveyor_stream", "orders"), (orders.channel, str(tick)),
                                  ("conveyor_stream", "other")])
