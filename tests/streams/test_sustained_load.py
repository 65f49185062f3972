"""Sustained load over many rotation periods: no dead tuples in the event tables, and
their size returns to near zero once the events are consumed and rotated away."""

from __future__ import annotations

import asyncio
import time

import pytest

from conveyor.core import streams
from conveyor.db import pool

RUN_SECONDS = 8.0


async def _table_stats(conn, stream: str) -> list[tuple[str, int, int]]:
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    cur = await conn.execute("""
        SELECT c.relname, coalesce(s.n_dead_tup, 0), pg_total_relation_size(c.oid)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
         WHERE n.nspname = 'conveyor' AND c.relkind = 'r'
           AND c.relname ~ ('^stream_' || (SELECT id FROM conveyor.streams WHERE name = %s) || '_[0-2]$')
         ORDER BY 1""", (stream,))
    return await cur.fetchall()


@pytest.mark.own_cluster  # rotation waits for transactions older than the switch, anywhere on the server
async def test_continuous_appends_and_consumption_leave_no_bloat(dsn):
    async with pool.connect(dsn) as conn:
        await streams.create(conn, "load", {"rotation_period": "1 second", "ticker_max_lag": "0 seconds"})
        await streams.subscribe(conn, "load", "reader")
    stop = asyncio.Event()
    sent = received = 0
    peak = 0
    operations: list[str] = []

    async def produce() -> None:
        nonlocal sent
        async with pool.connect(dsn) as conn:
            while not stop.is_set():
                await conn.execute("SELECT count(*) FROM conveyor.stream_send_batch('load', 'x', "
                                   "ARRAY(SELECT repeat('p', 200) FROM generate_series(1, 100)))")
                sent += 100
                await asyncio.sleep(0.01)

    async def consume() -> None:
        nonlocal received
        async with pool.connect(dsn) as conn:
            while not stop.is_set() or received < sent:
                events = await streams.receive(conn, "load", "reader", 1000000)
                if events:
                    received += len(events)
                    await streams.ack(conn, events[0].batch_id)
                else:
                    await asyncio.sleep(0.02)

    async def drive() -> None:
        nonlocal peak
        async with pool.connect(dsn) as conn:
            while not stop.is_set():
                await streams.ticker(conn)
                operations.extend(op for _, op, _ in await streams.maint(conn))
                peak = max(peak, sum(size for _, _, size in await _table_stats(conn, "load")))
                await asyncio.sleep(0.1)

    tasks = [asyncio.create_task(f()) for f in (produce, consume, drive)]
    await asyncio.sleep(RUN_SECONDS)
    stop.set()
    async with pool.connect(dsn) as conn:
        deadline = time.monotonic() + 20
        while received < sent and time.monotonic() < deadline:  # let the consumer finish
            await streams.force_tick(conn, "load")
            await asyncio.sleep(0.1)
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
        assert received == sent and sent > 10000
        rotations = operations.count("rotation_step1")
        assert rotations >= 4, f"many rotation periods went by ({rotations} rotations)"
        for _ in range(4):  # rotate the consumed events away: no new events, three more rotations
            await asyncio.sleep(1.05)
            await streams.force_tick(conn, "load")
            await streams.receive(conn, "load", "reader", 10)
            for _ in range(2):
                await streams.maint(conn)
        await asyncio.sleep(0.7)
        tables = await _table_stats(conn, "load")
    assert len(tables) == 3
    assert all(dead == 0 for _, dead, _ in tables), f"no dead tuples: {tables}"
    final = sum(size for _, _, size in tables)
    assert peak > 10 * final and final <= 3 * 16384, f"size back near zero: peak {peak}, now {final} ({tables})"
