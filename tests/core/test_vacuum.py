"""conveyor.tables_to_vacuum()'s bar and conveyor.core.vacuum against a real PostgreSQL:
a table is listed once its dead row versions reach 500 plus 5% of its live rows, a
VACUUM takes it off the list, dead rows a VACUUM had to keep (an older transaction may
see them) do not count again, and a role that may not vacuum a table never sees it."""

from __future__ import annotations

import asyncio
import time
import uuid

from conveyor import types
from conveyor.core import messages, queues, vacuum
from conveyor.db import pool

M = types.OutgoingMessage
TABLE = "conveyor.messages_shared"  # the standard queues' messages


async def stats(conn, table: str = TABLE) -> tuple[int, int, object]:
    """(dead, live, last_vacuum) of a table, after this session's own counts are flushed."""
    await conn.execute("SELECT pg_stat_force_next_flush()")  # flushed as the session goes idle
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    cur = await conn.execute("SELECT n_dead_tup, n_live_tup, last_vacuum FROM pg_stat_user_tables"
                             " WHERE schemaname || '.' || relname = %s", (table,))
    return await cur.fetchone()


async def due_soon(conn, expect: bool, timeout: float = 15.0) -> list[str]:
    """conveyor.tables_to_vacuum() once the statistics say what is expected of TABLE."""
    deadline = time.monotonic() + timeout
    while True:
        await stats(conn)
        due = await vacuum.due(conn)
        if (TABLE in due) == expect or time.monotonic() > deadline:
            return due
        await asyncio.sleep(0.1)


async def delete_some(conn, n: int) -> None:
    await conn.execute("DELETE FROM conveyor.messages WHERE id IN (SELECT id FROM conveyor.messages"
                       " WHERE queue_id = (SELECT id FROM conveyor.queues WHERE name = 'jobs') ORDER BY id LIMIT %s)",
                       (n,))


async def test_a_table_is_due_once_its_dead_rows_pass_the_bar_and_not_after_a_vacuum(conn):
    await queues.create(conn, "jobs")
    for _ in range(20):
        await messages.send_batch(conn, "jobs", [M(f"m{i}") for i in range(100)])
    await delete_some(conn, 400)  # 400 dead, 1,600 live: the bar is 580
    assert TABLE not in await due_soon(conn, expect=False)
    dead, live, _ = await stats(conn)
    assert (dead, live) == (400, 1600)

    await delete_some(conn, 200)  # 600 dead, 1,400 live: the bar is 570
    assert TABLE in await due_soon(conn, expect=True)
    assert TABLE in await vacuum.Vacuumer().run(conn)
    dead, live, last_vacuum = await stats(conn)
    assert (dead, live) == (0, 1400) and last_vacuum is not None
    assert TABLE not in await vacuum.due(conn)


async def test_a_role_that_may_not_vacuum_a_table_is_not_given_it(conn):
    await queues.create(conn, "jobs")
    for _ in range(10):
        await messages.send_batch(conn, "jobs", [M(f"m{i}") for i in range(100)])
    await delete_some(conn, 900)
    assert TABLE in await due_soon(conn, expect=True)
    role = f"conveyor_test_{uuid.uuid4().hex[:12]}"  # roles are the cluster's: one per test
    await conn.execute(f"CREATE ROLE {role} NOLOGIN IN ROLE conveyor_admin")
    try:
        await conn.execute(f"SET ROLE {role}")  # may call it, owns nothing
        assert await vacuum.due(conn) == []
    finally:
        await conn.execute("RESET ROLE")
        await conn.execute(f"DROP OWNED BY {role}")
        await conn.execute(f"DROP ROLE {role}")


async def test_a_table_dropped_since_it_was_listed_is_let_be(conn):
    assert await pool.vacuum(conn, "conveyor.messages_shared") is True
    assert await pool.vacuum(conn, "conveyor.no_such_table") is False


async def test_dead_rows_an_older_transaction_holds_do_not_call_for_a_vacuum_again(conn, dsn):
    await queues.create(conn, "jobs")
    for _ in range(20):
        await messages.send_batch(conn, "jobs", [M(f"m{i}") for i in range(100)])
    vacuumer = vacuum.Vacuumer()
    async with pool.connect(dsn, autocommit=False) as reader:
        await reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        await reader.execute("SELECT count(*) FROM conveyor.messages")  # its snapshot sees every row
        await delete_some(conn, 1000)  # 1,000 dead, 1,000 live: over the bar of 550
        assert TABLE in await due_soon(conn, expect=True)
        assert TABLE in await vacuumer.run(conn)
        dead, _, _ = await stats(conn)
        assert dead == 1000  # none could be removed
        assert TABLE in await vacuum.due(conn)  # by the bare count, it is still due
        assert TABLE not in await vacuum.due(conn, vacuumer.kept)  # not for the vacuumer
        assert TABLE not in await vacuumer.run(conn)
        await delete_some(conn, 600)  # 600 more, over the bar of 520 beyond the 1,000 kept
        assert TABLE in await due_soon_for(conn, vacuumer)
        await reader.rollback()
    assert TABLE in await vacuumer.run(conn)  # the reader is gone: all of them go
    dead, live, _ = await stats(conn)
    assert (dead, live) == (0, 400)
    assert TABLE not in await vacuumer.run(conn)


async def due_soon_for(conn, vacuumer: vacuum.Vacuumer, timeout: float = 15.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        await stats(conn)
        due = await vacuum.due(conn, vacuumer.kept)
        if TABLE in due or time.monotonic() > deadline:
            return due
        await asyncio.sleep(0.1)
