"""The server's vacuum worker (conveyor.server.workers.vacuum) against a real database: it
vacuums a table once its dead row versions pass conveyor.tables_to_vacuum()'s bar, and
only the process holding its advisory lock does so."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from conveyor import types
from conveyor.core import messages, queues, vacuum
from conveyor.server import workers
from support.locks import advisory_lock_holders
from support.server import ServerProcess

TABLE = "messages_shared"


async def last_vacuum(conn) -> object:
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    cur = await conn.execute("SELECT last_vacuum FROM pg_stat_user_tables WHERE schemaname = 'conveyor'"
                             " AND relname = %s", (TABLE,))
    return (await cur.fetchone())[0]


async def lock_holders(conn) -> list[int]:
    return await advisory_lock_holders(conn, vacuum.LOCK_KEY)


async def test_the_worker_vacuums_a_table_past_the_bar_in_one_process(dsn, conn):
    await queues.create(conn, "jobs")
    for _ in range(10):
        await messages.send_batch(conn, "jobs", [types.OutgoingMessage(f"m{i}") for i in range(100)])
    tasks = [asyncio.create_task(workers.vacuum(dsn, interval=0.05, retry_interval=0.1)) for _ in range(2)]
    try:
        deadline = time.monotonic() + 10
        while len(await lock_holders(conn)) < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # many intervals: nothing is over the bar yet
        assert await last_vacuum(conn) is None
        assert len(await lock_holders(conn)) == 1, "one process vacuums"

        await conn.execute("DELETE FROM conveyor.messages WHERE id % 10 <> 0")  # 900 dead, 100 live
        await conn.execute("SELECT pg_stat_force_next_flush()")
        deadline = time.monotonic() + 20
        while await last_vacuum(conn) is None:
            assert time.monotonic() < deadline, "timed out waiting for the worker to vacuum"
            await asyncio.sleep(0.05)
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        cur = await conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = 'conveyor'"
                                 " AND relname = %s", (TABLE,))
        assert (await cur.fetchone())[0] == 0
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


@pytest.mark.parametrize("interval, holders", [("1", 1), ("0", 0)])
async def test_serve_runs_the_worker_unless_told_not_to(dsn, conn, interval, holders):
    """`conveyor serve` (two processes here) vacuums in one of them; CONVEYOR_VACUUM_INTERVAL=0
    leaves it all to autovacuum."""
    server = ServerProcess(dsn, env={"CONVEYOR_WORKERS": "2", "CONVEYOR_VACUUM_INTERVAL": interval}).start()
    try:
        deadline = time.monotonic() + 10
        while len(await lock_holders(conn)) < holders and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        assert len(await lock_holders(conn)) == holders
    finally:
        server.terminate()
