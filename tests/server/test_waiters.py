"""The waiter hub: LISTEN wake-ups, counts, fallback polling, reconnects."""

from __future__ import annotations

import asyncio

from conveyor.core import queues
from conveyor.db import pool
from conveyor.server.waiters import WaiterHub


async def _hub(dsn: str, poll: float = 30.0) -> WaiterHub:
    async def mark(queue: str, seconds: int) -> None:
        async with pool.connect(dsn) as c:
            await queues.listen(c, queue, seconds)

    hub = WaiterHub(dsn, mark, listen_seconds=60, poll_fallback=poll)
    await hub.start()
    return hub


async def test_a_notification_wakes_as_many_waiters_as_messages(dsn, conn):
    await queues.create(conn, "jobs")
    hub = await _hub(dsn)
    try:
        await hub.ensure_marked("jobs")
        with hub.register("jobs") as a, hub.register("jobs") as b, hub.register("jobs") as c:
            await conn.execute("SELECT conveyor.message_send_batch('jobs', ARRAY['1', '2'])")
            woken = await asyncio.gather(a.wait(2), b.wait(2), c.wait(0.5))
        assert woken == [True, True, False], "two messages wake the two oldest waiters"
    finally:
        await hub.stop()


async def test_sends_do_not_notify_unless_the_queue_is_marked(dsn, conn):
    await queues.create(conn, "quiet")
    hub = await _hub(dsn)
    try:
        with hub.register("quiet") as w:
            await conn.execute("SELECT conveyor.message_send('quiet', 'x')")
            assert await w.wait(0.5) is False
    finally:
        await hub.stop()


async def test_fallback_poll_wakes_the_oldest_waiter(dsn):
    hub = await _hub(dsn, poll=0.2)
    try:
        with hub.register("any") as first, hub.register("any") as second:
            assert await first.wait(2) is True
            assert second.event.is_set() is False
    finally:
        await hub.stop()


async def test_mark_is_shared_and_cached(dsn, conn):
    await queues.create(conn, "jobs")
    calls = 0

    async def mark(queue: str, seconds: int) -> None:
        nonlocal calls
        calls += 1
        async with pool.connect(dsn) as c:
            await queues.listen(c, queue, seconds)

    hub = WaiterHub(dsn, mark, listen_seconds=60)
    await asyncio.gather(*(hub.ensure_marked("jobs") for _ in range(20)))
    await hub.ensure_marked("jobs")
    assert calls == 1


async def test_shutting_down_releases_everyone(dsn):
    hub = await _hub(dsn)
    try:
        with hub.register("a") as a, hub.register("b") as b:
            hub.shutting_down()
            assert await a.wait(1) and await b.wait(1)
            assert hub.closing
    finally:
        await hub.stop()


async def test_reconnect_wakes_waiters(dsn, conn):
    hub = await _hub(dsn)
    try:
        with hub.register("jobs") as w:
            await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE application_name = 'conveyor-listen' AND datname = current_database()")
            assert await w.wait(5) is True, "woken once LISTEN is back"
    finally:
        await hub.stop()
