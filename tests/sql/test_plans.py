"""Query plans: the hot paths use their indexes, whatever the backlog."""

from __future__ import annotations

from conveyor.core import queues


async def _plan(conn, sql: str, params: tuple = ()) -> str:
    cur = await conn.execute("EXPLAIN " + sql, params)
    return "\n".join(r[0] for r in await cur.fetchall())


async def test_receive_scans_the_visibility_index(conn):
    await queues.create(conn, "jobs")
    await conn.execute("SELECT count(*) FROM conveyor.message_send_batch('jobs', "
                       "array_fill('x'::text, ARRAY[5000]))")
    await conn.execute("ANALYZE conveyor.messages")
    plan = await _plan(conn, """
        SELECT m.id FROM conveyor.messages m
         WHERE m.queue_id = 1 AND m.vt <= now()
         ORDER BY m.vt, m.id LIMIT 10 FOR UPDATE SKIP LOCKED""")
    assert "messages_visible_idx" in plan and "Sort" not in plan


async def test_delete_and_lookup_use_the_primary_key(conn):
    await queues.create(conn, "jobs")
    await conn.execute("SELECT count(*) FROM conveyor.message_send_batch('jobs', "
                       "array_fill('x'::text, ARRAY[5000]))")
    await conn.execute("ANALYZE conveyor.messages")
    plan = await _plan(conn, "DELETE FROM conveyor.messages WHERE queue_id = 1 AND id = ANY (ARRAY[5, 6]::bigint[])")
    assert "messages_pkey" in plan


async def test_fifo_group_scan_uses_the_group_index(conn):
    await queues.create(conn, "q.fifo", {"content_based_deduplication": True})
    await conn.execute("""SELECT count(*) FROM conveyor.message_send_batch('q.fifo',
        ARRAY(SELECT 'm' || g FROM generate_series(1, 3000) g),
        group_ids => ARRAY(SELECT 'g' || (g % 50) FROM generate_series(1, 3000) g))""")
    await conn.execute("ANALYZE conveyor.messages")
    plan = await _plan(conn, """SELECT min(m.id) FROM conveyor.messages m
                                 WHERE m.queue_id = 1 AND m.group_id = 'g7'""")
    assert "messages_group_idx" in plan


async def _index_tuples_read(conn) -> int:
    """Index entries read in this transaction, in conveyor.messages and every partition of it."""
    cur = await conn.execute("SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(x.indexrelid)), 0)::bigint "
                             "FROM pg_index x JOIN pg_partition_tree('conveyor.messages') t ON t.relid = x.indrelid")
    return (await cur.fetchone())[0]


async def _rows_read(conn) -> int:
    """Index entries and rows of sequential scans read in this transaction, over
    conveyor.messages and its partitions."""
    cur = await conn.execute("SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(t.relid)), 0)::bigint "
                             "FROM pg_partition_tree('conveyor.messages') t")
    return await _index_tuples_read(conn) + (await cur.fetchone())[0]


async def test_message_calls_read_their_rows_only_on_a_queue_the_statistics_have_not_seen(conn):
    """Statistics taken before a queue existed estimate it at one row; planned with the
    call's values (custom plans), a receive, a delete by receipt or by id, an archive and
    a pop then read the whole queue's index range (migration 0014). Counted in one
    transaction: the index entries the calls read, against the 3000 messages queued."""
    await queues.create(conn, "known")
    await conn.execute("SELECT count(*) FROM conveyor.message_send_batch('known', array_fill('x'::text, ARRAY[50]))")
    await conn.execute("ANALYZE conveyor.messages")
    await queues.create(conn, "fresh")
    await conn.execute("SELECT count(*) FROM conveyor.message_send_batch('fresh', array_fill('x'::text, ARRAY[3000]))")
    async with conn.transaction():
        before = await _index_tuples_read(conn)
        for _ in range(6):  # past the five custom plans PostgreSQL tries first
            cur = await conn.execute("SELECT id, receive_count FROM conveyor.message_receive('fresh', 30, 2)")
            (first, count), (second, _) = await cur.fetchall()
            await conn.execute("SELECT conveyor.message_delete('fresh', ARRAY[%s]::bigint[], ARRAY[%s]::integer[])",
                               (first, count))
            await conn.execute("SELECT conveyor.message_archive('fresh', %s::bigint)", (second,))
            await conn.execute("SELECT conveyor.message_delete('fresh', %s::bigint)", (second + 1000,))
            await conn.execute("SELECT * FROM conveyor.message_pop('fresh')")
        read = await _index_tuples_read(conn) - before
    assert read < 600, f"{read} index entries read for 30 calls on a queue of 3000 messages"


async def test_a_receive_reads_its_rows_only_when_its_queue_is_most_of_the_table(conn):
    """With generic plans (migration 0014) the planner does not know a receive's qty: where
    one queue is most of conveyor.messages it estimated thousands of claimed rows and
    hashed the whole queue to update one (migration 0017). Counted in one transaction:
    the index entries and rows read by receives of 1 and 10 messages and the deletes after
    them (about 300; before 0017, 10,000 for each receive)."""
    await queues.create(conn, "busy")
    await conn.execute("SELECT count(*) FROM conveyor.message_send_batch('busy', array_fill('x'::text, ARRAY[10000]))")
    await conn.execute("ANALYZE conveyor.messages")
    async with conn.transaction():
        before = await _rows_read(conn)
        for qty in (1, 10) * 4:  # past the five custom plans PostgreSQL would try first
            cur = await conn.execute("SELECT id FROM conveyor.message_receive('busy', 30, %s)", (qty,))
            ids = [r[0] for r in await cur.fetchall()]
            assert len(ids) == qty
            await conn.execute("SELECT conveyor.message_delete('busy', %s::bigint[])", (ids,))
        read = await _rows_read(conn) - before
    assert read < 1000, f"{read} index entries and rows read for 16 calls on a queue of 10,000 messages"
