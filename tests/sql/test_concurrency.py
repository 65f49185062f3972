"""Two-session and many-session behaviour of the SQL API under real concurrency."""

from __future__ import annotations

import asyncio
import collections

from conveyor import types
from conveyor.core import messages, queues
from conveyor.db import pool

M = types.OutgoingMessage


async def test_concurrent_receivers_never_share_an_invisible_message(dsn, conn):
    await queues.create(conn, "jobs")
    total = 2000
    for start in range(0, total, 500):
        await messages.send_batch(conn, "jobs", [M(str(i)) for i in range(start, start + 500)])
    seen: list[int] = []

    async def receiver() -> None:
        async with pool.connect(dsn) as c:
            while True:
                got = await messages.receive(c, "jobs", qty=7, vt=600)
                if not got:
                    return
                seen.extend(m.id for m in got)

    await asyncio.gather(*(receiver() for _ in range(16)))
    counts = collections.Counter(seen)
    assert len(seen) == total, "every message delivered"
    assert max(counts.values()) == 1, "no message delivered twice while invisible"


async def test_concurrent_fifo_receivers_keep_group_order(dsn, conn):
    await queues.create(conn, "q.fifo")
    groups, per_group = 8, 40
    batch = [M(f"{g}:{i}", group_id=f"g{g}", dedup_id=f"{g}-{i}")
             for i in range(per_group) for g in range(groups)]
    await messages.send_batch(conn, "q.fifo", batch)
    delivered: dict[str, list[int]] = collections.defaultdict(list)
    in_flight: dict[str, int] = collections.Counter()
    violations: list[str] = []

    async def receiver() -> None:
        async with pool.connect(dsn) as c:
            idle = 0
            while idle < 5:
                got = await messages.receive(c, "q.fifo", qty=3, vt=600)
                if not got:
                    idle += 1
                    await asyncio.sleep(0.01)
                    continue
                idle = 0
                batch_groups = {m.group_id for m in got}
                for g in batch_groups:
                    if in_flight[g]:
                        violations.append(f"{g} received while in flight elsewhere")
                    in_flight[g] += 1
                for m in got:
                    delivered[m.group_id].append(int(m.body.split(":")[1]))
                await asyncio.sleep(0)  # let others try the same groups meanwhile
                # the database keeps the group blocked until the delete commits, so the
                # count may drop before it
                for g in batch_groups:
                    in_flight[g] -= 1
                await messages.delete(c, "q.fifo", [m.id for m in got])

    await asyncio.gather(*(receiver() for _ in range(8)))
    assert violations == []
    assert sorted(delivered) == [f"g{g}" for g in range(groups)]
    for seq in delivered.values():
        assert seq == list(range(per_group))


async def test_concurrent_fifo_senders_with_the_same_dedup_id_store_one(dsn, conn):
    await queues.create(conn, "q.fifo")

    async def sender() -> int:
        async with pool.connect(dsn) as c:
            return await messages.send(c, "q.fifo", M("x", group_id="g", dedup_id="same"))

    ids = await asyncio.gather(*(sender() for _ in range(10)))
    assert len(set(ids)) == 1
    assert len(await messages.peek(conn, "q.fifo")) == 1


async def test_receive_does_not_block_on_rows_locked_by_another_transaction(dsn, conn):
    await queues.create(conn, "jobs")
    a, b = [s.id for s in await messages.send_batch(conn, "jobs", [M("a"), M("b")])]
    async with pool.connect(dsn, autocommit=False) as holder:
        await holder.execute("SELECT 1 FROM conveyor.messages WHERE id = %s FOR UPDATE", (a,))
        got = await asyncio.wait_for(messages.receive(conn, "jobs", qty=2), 5)
        assert [m.id for m in got] == [b]
        await holder.rollback()


async def test_fifo_receive_stops_at_a_message_another_transaction_holds(dsn, conn):
    """A delete or a change of visibility under way on a message of a group: what it leaves
    is not known yet, so a receive takes the group's messages before it only (and waits
    for nothing)."""
    await queues.create(conn, "q.fifo")
    ids = [s.id for s in await messages.send_batch(conn, "q.fifo", [
        M(f"m{i}", group_id="g", dedup_id=str(i)) for i in range(3)])]
    async with pool.connect(dsn, autocommit=False) as holder:
        await holder.execute("SELECT 1 FROM conveyor.messages WHERE id = %s FOR UPDATE", (ids[1],))
        got = await asyncio.wait_for(messages.receive(conn, "q.fifo", qty=3, vt=0), 5)
        assert [m.body for m in got] == ["m0"]
        await holder.rollback()
    assert [m.body for m in await messages.receive(conn, "q.fifo", qty=3)] == ["m0", "m1", "m2"]


async def test_concurrent_pushes_that_create_partitions_never_deadlock(dsn):
    """Pushes of ten items over the partitions of a new queue, some there already and some
    made by the push: a push that locked the partitions it found before creating the others
    waited, holding them, for another push's uncommitted creation, which waited for them."""
    import random

    from conveyor import errors
    from conveyor.core import partitioned

    failures: list[str] = []
    rng = random.Random(7)
    plans = [[[rng.sample(range(48), 10) for _ in range(12)] for _ in range(8)] for _ in range(3)]

    async def pusher(queue: str, plan: list[list[int]]) -> None:
        async with pool.connect(dsn) as c:
            for names in plan:
                try:
                    await partitioned.push(c, [{"queue": queue, "partition": f"p{n}", "payload": {"n": n}}
                                               for n in names])
                except errors.ConveyorError as exc:
                    failures.append(f"{type(exc).__name__}: {exc.message}")

    for round_, workers in enumerate(plans):
        await asyncio.gather(*(pusher(f"created-{round_}", plan) for plan in workers))
    assert failures == []


async def test_metrics_of_every_queue_while_one_is_dropped(dsn, conn):
    """A snapshot that still sees a queue whose drop committed since (the depth scrape, the
    dashboard) reads its metrics without its sequence, which is gone: no error."""
    import psycopg

    await queues.create(conn, "stays")
    await queues.create(conn, "goes")
    async with await psycopg.AsyncConnection.connect(dsn) as reader:
        await reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await reader.execute("SELECT count(*) FROM conveyor.queues")  # the snapshot, both queues in it
        await queues.drop(conn, "goes")
        rows = await (await reader.execute("SELECT * FROM conveyor.queue_metrics_all()")).fetchall()
        assert [r[0] for r in rows] == ["goes", "stays"]
        await reader.execute("ROLLBACK")
