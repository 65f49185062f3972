"""An unlogged queue after a crash of PostgreSQL: crash recovery empties it (its table is
not in the WAL), a logged queue beside it keeps everything, and the unlogged queue goes
on working (docs/operations.md, "Unlogged queues")."""

from __future__ import annotations

from conveyor import types
from conveyor.core import messages, queues
from conveyor.db import migrate, pool

M = types.OutgoingMessage


async def test_a_crash_empties_an_unlogged_queue_and_only_it(cluster):
    async with pool.connect(cluster.dsn) as conn:
        await migrate.migrate(conn)
        await queues.create(conn, "fast", {"storage": "unlogged"})
        await queues.create(conn, "safe")
        await queues.create(conn, "parts", {"storage": "partitioned", "partition_interval": 100})
        for name in ("fast", "safe", "parts"):
            await messages.send_batch(conn, name, [M(f"{name}-{i}") for i in range(50)])
        await messages.archive(conn, "fast", [1, 2])  # an unlogged queue's archive is logged
        await conn.execute("CHECKPOINT")  # even written to disk, an unlogged table is reset
        await messages.send(conn, "fast", M("after the checkpoint"))

    cluster._pg_ctl("stop", "-w", "-m", "immediate", timeout=60)  # a crash: no shutdown checkpoint
    cluster.start()  # crash recovery

    async with pool.connect(cluster.dsn) as conn:
        assert await messages.peek(conn, "fast", qty=100) == []
        assert len(await messages.peek(conn, "safe", qty=100)) == 50
        assert len(await messages.peek(conn, "parts", qty=100)) == 50
        cur = await conn.execute("SELECT a.id FROM conveyor.archive a JOIN conveyor.queues q ON q.id = a.queue_id "
                                 "WHERE q.name = 'fast' ORDER BY a.id")
        assert await cur.fetchall() == [(1,), (2,)]
        fast = await queues.get(conn, "fast")
        assert fast.unlogged  # the queue, its settings and its id sequence are logged
        # it goes on, its ids after those it had: the sequence is logged (ahead by up to 32
        # values after a crash, as every PostgreSQL sequence is)
        again = await messages.send(conn, "fast", M("again"))
        assert 51 < again <= 51 + 33
        got = await messages.receive(conn, "fast", qty=10, vt=30)
        assert [(m.id, m.body) for m in got] == [(again, "again")]
        assert await messages.delete(conn, "fast", [again]) == [again]
