"""Queue storage kinds (migration 0016): unlogged and partitioned queues behave as every
queue does, keep their rows in tables of their own, and maintenance keeps partitions
ahead, drops expired ones whole and drops the tables of deleted queues."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from conveyor import errors, types
from conveyor.core import messages, queues, streams, vacuum
from conveyor.db import pool

M = types.OutgoingMessage

KINDS = {
    "unlogged": {"storage": "unlogged"},
    "by_id": {"storage": "partitioned", "partition_interval": 10, "partition_premake": 2},
    "by_time": {"storage": "partitioned", "partition_interval": "1 hour", "partition_retention": "1 day"},
}


async def _tables(conn, queue: str, table: str = "messages") -> set[str]:
    """The tables the queue's rows are in (by tableoid)."""
    cur = await conn.execute(f"SELECT DISTINCT t.tableoid::regclass::text FROM conveyor.{table} t "
                             "JOIN conveyor.queues q ON q.id = t.queue_id WHERE q.name = %s", (queue,))
    return {r[0] for r in await cur.fetchall()}


async def _maintain(conn) -> dict[str, int]:
    return await queues.maintenance(conn)


@pytest.mark.parametrize("kind", KINDS)
async def test_every_operation_on_each_kind(conn, kind):
    q = await queues.create(conn, "jobs", KINDS[kind])
    assert q.storage == ("unlogged" if kind == "unlogged" else "partitioned")
    sent = await messages.send_batch(conn, "jobs", [M(f"m{i}") for i in range(25)])
    assert [s.id for s in sent] == list(range(1, 26))
    got = await messages.receive(conn, "jobs", qty=3, vt=60)
    assert [m.body for m in got] == ["m0", "m1", "m2"] and all(m.receive_count == 1 for m in got)
    assert await messages.receive(conn, "jobs", qty=3, vt=60) != got  # in flight: not again
    assert [m.id for m in await messages.set_vt(conn, "jobs", [1], 0, in_flight_only=True)] == [1]
    rest = await messages.receive(conn, "jobs", qty=100, vt=60)
    assert [(m.id, m.receive_count) for m in rest] == [(1, 2)] + [(i, 1) for i in range(7, 26)]
    assert await messages.delete(conn, "jobs", [1, 999]) == [1]
    assert await messages.archive(conn, "jobs", [2]) == [2]
    assert await messages.fail(conn, "jobs", 3, "bad") is True  # no DLQ: to the archive as failed
    await messages.set_vt(conn, "jobs", [7, 8], 0)
    assert [m.id for m in await messages.pop(conn, "jobs", qty=5)] == [7, 8]
    assert [m.id for m in await messages.peek(conn, "jobs", qty=2)] == [4, 5]
    metrics = await queues.metrics(conn, "jobs")
    assert (metrics.queue_length + metrics.in_flight, metrics.total_messages) == (20, 25)
    own = {t.table_name for t in await queues.storage(conn, "jobs")}
    assert await _tables(conn, "jobs") <= {f"conveyor.{t}" for t in own}
    assert await _tables(conn, "jobs", "archive") <= {f"conveyor.{t}" for t in own}
    assert await queues.purge(conn, "jobs") == 20
    assert await messages.peek(conn, "jobs") == []


@pytest.mark.parametrize("kind", KINDS)
async def test_fifo_on_each_kind(conn, kind):
    await queues.create(conn, "q.fifo", {**KINDS[kind], "content_based_deduplication": True})
    await messages.send_batch(conn, "q.fifo", [M("a1", group_id="a"), M("b1", group_id="b"), M("a2", group_id="a"),
                                                M("a1", group_id="a")])  # a duplicate
    first = await messages.receive(conn, "q.fifo", qty=1, vt=60)
    assert [m.body for m in first] == ["a1"]
    assert [m.body for m in await messages.receive(conn, "q.fifo", qty=10, vt=60)] == ["b1"]
    await messages.delete(conn, "q.fifo", [first[0].id])
    assert [m.body for m in await messages.receive(conn, "q.fifo", qty=10)] == ["a2"]


async def test_dead_letters_move_between_kinds(conn):
    await queues.create(conn, "dlq", KINDS["unlogged"])
    await queues.create(conn, "work", {**KINDS["by_id"], "max_receive_count": 1, "dead_letter_queue": "dlq"})
    await messages.send(conn, "work", M("poison"))
    assert len(await messages.receive(conn, "work", vt=0)) == 1
    assert await messages.receive(conn, "work") == []  # past max_receive_count: moved
    [dead] = await messages.peek(conn, "dlq")
    assert dead.body == "poison" and dead.id == 1
    assert await _tables(conn, "dlq") == {f"conveyor.{(await queues.storage(conn, 'dlq'))[0].table_name}"}


async def test_ids_of_queues_with_storage_of_their_own(conn):
    plain = await queues.create(conn, "plain")
    kinds = [await queues.create(conn, name, KINDS[name]) for name in KINDS]
    cur = await conn.execute("SELECT name, id FROM conveyor.queues ORDER BY id")
    ids = dict(await cur.fetchall())
    assert ids[plain.name] < 1_000_000_000 <= min(ids[k.name] for k in kinds)
    assert [(t.table_name, t.unlogged) for t in await queues.storage(conn, "plain")] \
        == [("messages_shared", False), ("archive_shared", False)]
    # an unlogged queue's archive is a logged table (as pgmq keeps a_ tables logged)
    assert [(t.holds, t.unlogged) for t in await queues.storage(conn, "unlogged")] \
        == [("messages", True), ("archive", False)]


async def test_storage_is_chosen_once(conn):
    await queues.create(conn, "u", KINDS["unlogged"])
    assert (await queues.create(conn, "u", {"storage": "unlogged"})).storage == "unlogged"
    assert (await queues.create(conn, "u")).storage == "unlogged"  # nothing said: matches
    with pytest.raises(errors.QueueAlreadyExists):
        await queues.create(conn, "u", {"storage": "partitioned"})
    with pytest.raises(errors.InvalidInput, match="chosen when it is created"):
        await queues.alter(conn, "u", {"storage": "logged"})
    with pytest.raises(errors.InvalidInput, match="partitioned queues only"):
        await queues.create(conn, "x", {"partition_premake": 3})
    with pytest.raises(errors.InvalidInput, match="whole months"):
        await queues.create(conn, "x", {"storage": "partitioned", "partition_interval": "1 mon 2 days"})
    with pytest.raises(errors.InvalidInput, match="whole number of ids"):
        await queues.create(conn, "x", {"storage": "partitioned", "partition_interval": 10,
                                        "partition_retention": "1 day"})


async def test_partitions_ahead_gaps_filled_and_expired_dropped_by_id(conn):
    await queues.create(conn, "p", {"storage": "partitioned", "partition_interval": 10, "partition_retention": 20,
                                    "partition_premake": 2})
    made = [(t.range_from, t.range_to) for t in await queues.storage(conn, "p") if t.holds == "messages"]
    assert made == [("0", "10"), ("10", "20"), ("20", "30"), (None, None)]
    await messages.send_batch(conn, "p", [M(str(i)) for i in range(55)])  # ids 30-55 overflow to DEFAULT
    tables = await _tables(conn, "p")
    assert any(t.endswith("_default") for t in tables)
    done = await _maintain(conn)
    # made: 30-40 and 40-50 (missed: behind the newest id, 55), 50-60 and two ahead, for the
    # messages and the archive; dropped: what ends 20 ids or more behind 55 (0-10, 10-20, 20-30)
    assert (done["partitions_created"], done["expired_partitions"]) == (10, 6)
    after = [t.range_from for t in await queues.storage(conn, "p") if t.holds == "messages"]
    assert after == ["30", "40", "50", "60", "70", None]
    assert not any(t.endswith("_default") for t in await _tables(conn, "p"))  # moved out of DEFAULT
    assert [m.id for m in await messages.peek(conn, "p", qty=100)] == list(range(30, 56))
    again = await _maintain(conn)
    assert (again["partitions_created"], again["expired_partitions"]) == (0, 0)


async def test_maintenance_is_not_kept_out_by_the_servers_session_locks(conn, dsn):
    """A running server holds the stream ticker's and the vacuum's advisory locks for as
    long as it runs; the storage upkeep's own lock is another key, so it still runs."""
    await queues.create(conn, "p", {"storage": "partitioned", "partition_interval": 10, "partition_retention": 20,
                                    "partition_premake": 2})
    await messages.send_batch(conn, "p", [M(str(i)) for i in range(55)])
    async with pool.connect(dsn) as ticker, pool.connect(dsn) as vacuumer:
        assert await streams.take_ticker_lock(ticker) and await vacuum.take_lock(vacuumer)
        done = await _maintain(conn)
    assert (done["partitions_created"], done["expired_partitions"]) == (10, 6)


async def test_time_partitions_and_their_retention(conn):
    await queues.create(conn, "t", {"storage": "partitioned", "partition_interval": "1 hour",
                                    "partition_retention": "2 hours", "partition_premake": 1})
    made = [t for t in await queues.storage(conn, "t") if t.holds == "messages"]
    assert len(made) == 3 and made[-1].is_default
    await messages.send_batch(conn, "t", [M("now"), M("old")])
    # a message from three hours ago lands in the DEFAULT partition, and moves to its own
    # partition when that is made; which retention then drops whole
    await conn.execute("UPDATE conveyor.messages SET sent_at = now() - interval '3 hours' WHERE body = 'old'")
    assert any(t.endswith("_default") for t in await _tables(conn, "t"))
    await conn.execute("""SELECT conveyor._storage_partition(q, 'messages',
                              to_char(x.lo AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS+00'),
                              to_char((x.lo + interval '1 hour') AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS+00'),
                              '_old')
                            FROM conveyor.queues q,
                                 (SELECT date_bin('1 hour', m.sent_at, '2000-01-01 00:00+00') AS lo
                                    FROM conveyor.messages m WHERE m.body = 'old') x
                           WHERE q.name = 't'""")
    assert not any(t.endswith("_default") for t in await _tables(conn, "t"))
    done = await _maintain(conn)
    assert done["expired_partitions"] == 1
    assert [m.body for m in await messages.peek(conn, "t")] == ["now"]


async def test_queue_drop_leaves_its_tables_to_maintenance(conn, dsn):
    for name in KINDS:
        await queues.create(conn, name, KINDS[name])
        await messages.send(conn, name, M("x"))
    cur = await conn.execute("SELECT count(*) FROM pg_class WHERE relname ~ '^(messages|archive)_q[0-9]+$'")
    assert (await cur.fetchone())[0] == 6
    for name in KINDS:
        assert await queues.drop(conn, name) is True
    # a transaction reading conveyor.messages holds off the drop (lock_timeout): next run
    async with pool.connect(dsn) as other:
        await other.set_autocommit(False)
        await other.execute("SELECT count(*) FROM conveyor.messages, conveyor.archive")
        assert (await _maintain(conn))["dropped_queue_tables"] == 0
        await other.rollback()
    assert (await _maintain(conn))["dropped_queue_tables"] == 6
    cur = await conn.execute("SELECT count(*) FROM pg_class WHERE relname ~ '^(messages|archive)_q[0-9]'")
    assert (await cur.fetchone())[0] == 0
    # a new queue of the same name is a new queue, with new tables
    await queues.create(conn, "unlogged", KINDS["unlogged"])
    assert [m.body for m in await messages.peek(conn, "unlogged")] == []


async def test_creating_a_queue_does_not_wait_for_traffic(conn, dsn):
    """Attaching a new queue's table takes no lock that sends and receives hold."""
    await queues.create(conn, "busy")
    await messages.send(conn, "busy", M("x"))
    async with pool.connect(dsn) as other:
        await other.set_autocommit(False)
        assert len(await messages.receive(other, "busy", vt=60)) == 1  # holds row and table locks
        await conn.execute("SET lock_timeout = '2s'")
        await asyncio.wait_for(queues.create(conn, "fresh", KINDS["by_id"]), 10)
        await other.commit()


async def test_migration_kept_the_shared_tables(conn):
    cur = await conn.execute("""SELECT c.relname, c.relkind, pg_get_expr(c.relpartbound, c.oid)
                                  FROM pg_class c WHERE c.relname IN ('messages', 'messages_shared', 'archive',
                                                                      'archive_shared')
                                   AND c.relnamespace = 'conveyor'::regnamespace ORDER BY 1""")
    assert await cur.fetchall() == [
        ("archive", "p", None), ("archive_shared", "r", "FOR VALUES FROM (MINVALUE) TO ('1000000000')"),
        ("messages", "p", None), ("messages_shared", "r", "FOR VALUES FROM (MINVALUE) TO ('1000000000')")]
    with pytest.raises(psycopg.errors.SequenceGeneratorLimitExceeded):
        await conn.execute("SELECT setval(pg_get_serial_sequence('conveyor.queues', 'id'), 999999999);"
                           "SELECT nextval(pg_get_serial_sequence('conveyor.queues', 'id'))")


async def _plan_modes(conn) -> dict[str, str]:
    """The plan_cache_mode of each message function that sets one (migration 0014's), by name."""
    cur = await conn.execute("SELECT DISTINCT p.proname, c FROM pg_proc p, unnest(p.proconfig) c "
                             "WHERE p.pronamespace = 'conveyor'::regnamespace AND c LIKE 'plan_cache_mode=%'")
    return {name: c.split("=", 1)[1] for name, c in await cur.fetchall()}


async def _modes(conn) -> tuple[set[str], set[str]]:
    """The modes of the sends, and of every other message function. (Partitioned queues'
    functions keep generic plans whatever the storage: their tables are not conveyor.messages.)"""
    modes = await _plan_modes(conn)
    assert {m for name, m in modes.items() if name.startswith("pqueue_")} == {"force_generic_plan"}
    sends = {m for name, m in modes.items() if name.startswith("message_send")}
    return sends, {m for name, m in modes.items() if not name.startswith(("message_send", "pqueue_"))}


async def test_message_plans_follow_the_storage(conn):
    """Generic plans while every queue is in the shared tables; per-call plans (which plan
    and lock only the queue's own partition) for the functions that read or change
    messages while any queue has tables of its own; generic again once maintenance has
    dropped the last of them (conveyor._message_plans). Sends keep generic plans."""
    generic, custom = {"force_generic_plan"}, {"force_custom_plan"}
    names = set(await _plan_modes(conn))
    assert {"message_receive", "message_delete", "message_pop", "message_send"} <= names
    assert await _modes(conn) == (generic, generic)
    await queues.create(conn, "plain")
    assert await _modes(conn) == (generic, generic)
    for name in KINDS:
        await queues.create(conn, name, KINDS[name])
        assert await _modes(conn) == (generic, custom)
    await messages.send(conn, "by_id", M("x"))
    assert [m.body for m in await messages.receive(conn, "by_id", vt=60)] == ["x"]
    for name in KINDS:
        await queues.drop(conn, name)
    assert await _modes(conn) == (generic, custom)  # their tables are still there
    await _maintain(conn)
    assert await _modes(conn) == (generic, generic)
    assert set(await _plan_modes(conn)) == names
