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
