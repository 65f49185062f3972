"""LISTEN (conveyor.db.listen): the notifications of the channels listened to, in order,
however many one read brings; and a broken connection ends the stream with
errors.Unavailable, which the long-poll hub and the stream consumer reconnect after."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from conveyor import errors
from conveyor.db import listen


async def _listening(dsn: str, channels: list[str]) -> tuple[asyncio.Queue, asyncio.Task]:
    got: asyncio.Queue = asyncio.Queue()
    ready = asyncio.Event()

    async def on_listening() -> None:
        ready.set()

    async def run() -> None:
        try:
            async for note in listen.notifications(dsn, channels, on_listening):
                await got.put(note)
        except errors.ConveyorError as exc:
            await got.put(exc)

    task = asyncio.create_task(run())
    await asyncio.wait_for(ready.wait(), 10)
    return got, task


async def test_notifications_come_in_order_with_their_channel(dsn):
    got, task = await _listening(dsn, ["conveyor_a", "conveyor_b"])
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
            await other.execute("SELECT pg_notify('conveyor_a', '1 one')")
            await other.execute("SELECT pg_notify('conveyor_other', 'not listened to')")
            async with other.transaction():  # delivered together, at the commit
                for n in range(5):
                    await other.execute("SELECT pg_notify('conveyor_b', %s)", (f"{n} ünïcode",))
        notes = [await asyncio.wait_for(got.get(), 10) for _ in range(6)]
        assert notes == [("conveyor_a", "1 one")] + [("conveyor_b", f"{n} ünïcode") for n in range(5)]
        assert got.empty()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_broken_connection_ends_the_notifications_with_unavailable(dsn):
    got, task = await _listening(dsn, ["conveyor_a"])
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
        await other.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE application_name = 'conveyor-listen' AND datname = current_database()")
    assert isinstance(await asyncio.wait_for(got.get(), 10), errors.Unavailable)
    await asyncio.wait_for(task, 10)
