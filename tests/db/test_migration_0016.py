"""Migration 0016 turns conveyor.messages and conveyor.archive into partitioned tables on a
database that has data: every row, index, grant, function and view survives."""

from __future__ import annotations

import psycopg
import pytest

from conveyor import types
from conveyor.core import messages, queues
from conveyor.db import migrate, pool


async def _migrate_before(conn, version: int, dialects: tuple[str, ...]) -> None:
    """What `migrate` did before ``version`` existed: the older migrations, recorded, and
    the first migration of each dialect."""
    async with conn.transaction():
        await conn.execute(migrate.BOOTSTRAP)
        for m in migrate.migrations():
            if m.version < version:
                await conn.execute(m.sql)
                await conn.execute("INSERT INTO conveyor.schema_migrations (version, name, checksum) "
                                   "VALUES (%s, %s, %s)", (m.version, m.name, m.checksum))
        for dialect in dialects:
            m = migrate.migrations(dialect)[0]
            await conn.execute(m.sql)
            await conn.execute("INSERT INTO conveyor.dialect_migrations (dialect, version, name, checksum) "
                               "VALUES (%s, %s, %s, %s)", (dialect, m.version, m.name, m.checksum))


async def _rows(conn, table: str) -> list[tuple]:
    cur = await conn.execute(f"SELECT * FROM conveyor.{table} ORDER BY queue_id, id")
    return await cur.fetchall()


async def test_rows_indexes_grants_and_views_survive(empty_dsn):
    async with pool.connect(empty_dsn) as conn:
        await _migrate_before(conn, 14, ("pgmq", "hq"))
        await conn.execute("SELECT conveyor.queue_create('jobs'), conveyor.queue_create('q.fifo', "
                           "'{\"content_based_deduplication\": true}'), pgmq.create('pg')")
        await conn.execute("SELECT conveyor.message_send_batch('jobs', ARRAY(SELECT 'm' || g FROM generate_series(1, 300) g))")
        await conn.execute("SELECT conveyor.message_send('q.fifo', 'f', group_id => 'g')")
        await conn.execute("SELECT pgmq.send('pg', '{\"n\": 1}')")
        await conn.execute("SELECT count(*) FROM conveyor.message_receive('jobs', 60, 5)")
        await conn.execute("SELECT conveyor.message_archive('jobs', ARRAY[6, 7]::bigint[])")
        before = (await _rows(conn, "messages"), await _rows(conn, "archive"))

        await migrate.migrate(conn)

        cur = await conn.execute("SELECT relkind FROM pg_class WHERE oid = 'conveyor.messages'::regclass")
        assert (await cur.fetchone())[0] == "p"
        assert (await _rows(conn, "messages"), await _rows(conn, "archive")) == before
        # the queue functions go on as before, returning rows of the (new) conveyor.messages
        cur = await conn.execute("SELECT DISTINCT prorettype::regtype::text FROM pg_proc WHERE proname = 'message_receive'")
        assert await cur.fetchall() == [("conveyor.messages",)]
        got = await messages.receive(conn, "jobs", qty=2, vt=60)
        assert [m.id for m in got] == [8, 9]
        assert await messages.delete(conn, "jobs", [1, 8]) == [1, 8]
        assert [m.body for m in await messages.receive(conn, "q.fifo")] == ["f"]
        # the shared table kept its indexes, attached to the parent's, and hq's too
        cur = await conn.execute("""SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                                     WHERE i.indrelid = 'conveyor.messages_shared'::regclass
                                       AND EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = c.oid)
                                     ORDER BY 1""")
        assert [r[0] for r in await cur.fetchall()] == ["messages_group_idx",
                                                        "messages_shared_message_uuid_idx",  # hq's (hq/0002)
                                                        "messages_shared_queue_id_group_id_vt_idx",  # 0020's
                                                        "messages_visible_idx"]
        # pgmq's view of an existing queue reads the parent now
        cur = await conn.execute("SELECT msg_id FROM pgmq.q_pg")
        assert await cur.fetchall() == [(1,)]
        cur = await conn.execute("SELECT pg_get_viewdef('pgmq.q_pg') LIKE '%conveyor.messages m%'")
        assert (await cur.fetchone())[0] is True
        # a new queue of each kind beside the old ones
        await queues.create(conn, "fast", {"storage": "unlogged"})
        assert await messages.send(conn, "fast", types.OutgoingMessage("x")) == 1
        cur = await conn.execute("SELECT count(*) FROM pgmq.q_pg")
        assert (await cur.fetchone())[0] == 1

    # grants: the writer role still receives, the reader still reads the tables
    async with pool.connect(empty_dsn) as conn:
        await conn.execute("SET ROLE conveyor_writer")
        assert len(await messages.receive(conn, "jobs", qty=1, vt=60)) == 1
        await conn.execute("SET ROLE conveyor_reader")
        cur = await conn.execute("SELECT count(*) FROM conveyor.messages")
        assert (await cur.fetchone())[0] == 300 - 4 + 2 + 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute("SELECT conveyor.message_receive('jobs')")
