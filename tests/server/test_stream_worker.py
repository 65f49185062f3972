"""The server's stream worker (conveyor.server.workers.stream_ticker) against a real
database: it ticks and runs maintenance; only the process holding the ticker's advisory
lock does so, and another takes over when it goes away.

The worker runs as a task in the test's event loop, with the intervals from Settings
made small."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Awaitable, Callable

import pytest

from conveyor import types
from conveyor.core import streams
from conveyor.db import pool
from conveyor.server import workers
from conveyor.settings import Settings
from support.locks import advisory_lock_holders

SETTINGS = Settings(stream_tick_interval=0.05, stream_maint_interval=0.1)
S = "orders"


def start_worker(dsn: str) -> asyncio.Task[None]:
    return asyncio.create_task(workers.stream_ticker(
        dsn, tick_interval=SETTINGS.stream_tick_interval, maint_interval=SETTINGS.stream_maint_interval,
        retry_interval=0.1))


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def eventually(check: Callable[[], Awaitable[object]], what: str, timeout: float = 20.0) -> object:
    deadline = time.monotonic() + timeout
    while not (result := await check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
    return result


async def lock_holders(conn) -> list[int]:
    return await advisory_lock_holders(conn, streams.TICKER_LOCK_KEY)


async def tick_count(conn) -> int:
    cur = await conn.execute("SELECT count(*) FROM conveyor.stream_ticks")
    return (await cur.fetchone())[0]


async def test_the_worker_ticks_and_moves_due_events(dsn, conn):
    await streams.create(conn, S, {"ticker_max_lag": 0})
    await streams.subscribe(conn, S, "c")
    worker = start_worker(dsn)
    try:
        [event_id] = await streams.append(conn, S, [types.StreamEventIn(payload="now")])
        [got] = await eventually(lambda: streams.receive(conn, S, "c"), "the worker to tick the event")
        assert got.id == event_id
        await streams.ack(conn, got.batch_id)

        # maintenance: a scheduled event and a retry are moved into the stream when due
        await streams.append_at(conn, S, types.StreamEventIn(payload="later"),
                                dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.3))
        [later] = await eventually(lambda: streams.receive(conn, S, "c"), "the scheduled event")
        assert later.payload == "later"
        # a retried event keeps its id, so it does not count as a new event for
        # ticker_max_count / ticker_max_lag: the idle tick brings it (made short here)
        await streams.configure(conn, S, {"ticker_idle_period": "0.2 seconds"})
        assert await streams.nack(conn, later.batch_id, later.id, dt.timedelta(0)) == "retry"
        await streams.ack(conn, later.batch_id)
        [again] = await eventually(lambda: streams.receive(conn, S, "c"), "the retried event")
        assert (again.id, again.retry_count) == (later.id, 1)
        await streams.ack(conn, again.batch_id)
    finally:
        await stop(worker)


async def test_only_the_holder_of_the_lock_ticks_and_another_takes_over(dsn, conn):
    await streams.create(conn, S, {"ticker_max_lag": 0})
    await streams.subscribe(conn, S, "c")
    async with pool.connect(dsn) as first:  # the first instance: holds the lock, does not tick
        assert await streams.take_ticker_lock(first) is True
        [(first_pid,)] = await (await first.execute("SELECT pg_backend_pid()")).fetchall()
        second = start_worker(dsn)
        try:
            ticks = await tick_count(conn)
            await streams.append(conn, S, [types.StreamEventIn(payload="waiting")])
            await asyncio.sleep(0.6)  # a dozen tick intervals, several lock retries
            assert await tick_count(conn) == ticks, "the second instance did not tick"
            assert await streams.receive(conn, S, "c") == []
            assert await lock_holders(conn) == [first_pid]
        except BaseException:
            await stop(second)
            raise
    # the first instance is gone (its connection closed): the second takes over
    try:
        [got] = await eventually(lambda: streams.receive(conn, S, "c"), "the second instance to tick")
        assert got.payload == "waiting"
        await streams.ack(conn, got.batch_id)
        [second_pid] = await lock_holders(conn)
        assert second_pid != first_pid

        third = start_worker(dsn)  # yet another instance waits while the second runs
        try:
            await asyncio.sleep(0.3)
            assert await lock_holders(conn) == [second_pid]
            await stop(second)
            async def new_holder() -> list[int]:  # the second's connection may close a moment after its task
                return [pid for pid in await lock_holders(conn) if pid != second_pid]

            [third_pid] = await eventually(new_holder, "the third instance to take the lock")
            assert third_pid not in (first_pid, second_pid)
            # appended while the third may be ticking: a tick that counts its id but
            # cannot see it yet is followed by another once it commits
            await streams.append(conn, S, [types.StreamEventIn(payload="after")])
            [after] = await eventually(lambda: streams.receive(conn, S, "c"), "the third instance to tick")
            assert after.payload == "after"
        finally:
            await stop(third)
    finally:
        await stop(second)


def test_jobs_reading_every_queue_wait_longer_when_they_get_slow():
    """A job bounded by a share of a core (the depth scrape, the history: their cost grows
    with the backlog) waits its interval while it is quick, and ten times as long as it
    took (less its own time) once it is slow; other jobs wait their interval."""
    assert workers.pause(15.0, 0.2, workers.SCAN_SHARE) == 15.0
    assert workers.pause(15.0, 3.0, workers.SCAN_SHARE) == pytest.approx(27.0)  # 3 s of every 30: 10%
    assert workers.pause(1.0, 3.0) == 1.0
