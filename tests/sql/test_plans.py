"""Query plans: the hot paths use their indexes, whatever the backlog."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from conftest import create_database, drop_database, unique_name
from conveyor.core import queues
from dialects import pgmq_support
from support import xmin


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


# -- every hot statement, over a backlog ------------------------------------------------------
#
# A backlog loaded in bulk (one INSERT ... SELECT per queue, as a burst of sends leaves it)
# into tables never analyzed since (autovacuum off for them), and the same after ANALYZE:
# each hot call, run under the plans the functions keep (generic ones), may read a bounded
# number of index entries and rows per message it handles, never a share of the backlog
# (migration 0020; before it, a delete of 10 by receipt read every message of its queue).

BACKLOG = 20_000
GROUPS = 20
# rows read allowed per call: PER_CALL + PER_MESSAGE x messages handled (FIFO and grouped
# receives look at every group holding messages, a few probes each: GROUPS of them here)
PER_MESSAGE, PER_CALL = 12, 60 + 6 * GROUPS


@pytest.fixture(scope="module")
def backlog_template(template_db: str) -> Iterator[str]:
    """Conveyor with the pgmq dialect, and nothing else yet."""
    name = unique_name("conveyor_backlog_tpl")
    pgmq_support.install_dialect(create_database(name, template=template_db))
    yield name
    drop_database(name)


def _load_backlog(sql: psycopg.Connection) -> None:
    """BACKLOG messages waiting in each of several queues (and a partitioned queue's
    partition, and a stream consumer's ticks), inserted in bulk beneath the API."""
    run = sql.execute
    run("SELECT conveyor.queue_create('dlq')")
    run("SELECT conveyor.queue_create('jobs')")
    run("SELECT conveyor.queue_create('small')")
    run("""SELECT conveyor.queue_create('limited', '{"max_receive_count": 3, "dead_letter_queue": "dlq"}')""")
    run("""SELECT conveyor.queue_create('grouped')""")
    run("""SELECT conveyor.queue_create('jobs.fifo', '{"content_based_deduplication": true}')""")
    run("SELECT conveyor.queue_create('graveyard')")  # dead letters (of jobs), for move tasks
    run("""SELECT conveyor.queue_create('buried', '{"max_receive_count": 3, "dead_letter_queue": "graveyard"}')""")
    run("SELECT pgmq.create('pg')")
    for queue, group in (("jobs", "NULL"), ("limited", "NULL"), ("grouped", f"'g' || mod(g, {GROUPS})"),
                         ("jobs.fifo", f"'g' || mod(g, {GROUPS})"), ("pg", "NULL")):
        run(f"""INSERT INTO conveyor.messages (queue_id, id, vt, sent_at, body, group_id)
                SELECT q.id, g, now() - interval '1 minute', now(), 'x', {group}
                  FROM conveyor.queues q, generate_series(1, {BACKLOG}) g WHERE q.name = %s""".encode(), (queue,))
        run("SELECT setval(q.seq, %s) FROM conveyor.queues q WHERE q.name = %s", (BACKLOG, queue))
    run(f"""INSERT INTO conveyor.messages (queue_id, id, vt, sent_at, body, source_queue_id)
            SELECT q.id, g, now() - interval '1 minute', now(), 'x', (SELECT j.id FROM conveyor.queues j WHERE j.name = 'jobs')
              FROM conveyor.queues q, generate_series(1, {BACKLOG}) g WHERE q.name = 'graveyard'""")
    run("SELECT setval(q.seq, %s) FROM conveyor.queues q WHERE q.name = 'graveyard'", (BACKLOG,))
    run(f"""INSERT INTO conveyor.message_groups (queue_id, group_id)
            SELECT q.id, 'g' || k FROM conveyor.queues q, generate_series(0, {GROUPS - 1}) k WHERE q.name = 'jobs.fifo'""")
    run("SELECT conveyor.pqueue_push(%s::jsonb)", (Jsonb([{"queue": "pq", "partition": p, "payload": 0,
                                                          "transactionId": "first"} for p in ("a", "b", "c")]),))
    run("""SELECT conveyor.pqueue_configure('pq', '{"maxWaitTimeSeconds": 3600}')""")
    run(f"""INSERT INTO conveyor.partition_messages (partition_id, seq, transaction_id, payload)
            SELECT p.id, g + 1, 't' || g, '0' FROM conveyor.partitions p JOIN conveyor.pqueues q ON q.id = p.queue_id,
                   generate_series(1, {BACKLOG}) g WHERE q.name = 'pq'""")
    run(f"""UPDATE conveyor.partitions p SET head = {BACKLOG + 1}, head_xid = pg_current_xact_id()
              FROM conveyor.pqueues q WHERE q.id = p.queue_id AND q.name = 'pq'""")
    # partition c: half of it consumed already (kept, as a partitioned queue keeps messages)
    run("SELECT conveyor.pqueue_pop('{\"queue\": \"pq\", \"partition\": \"c\", \"autoAck\": true}')")
    run(f"""UPDATE conveyor.partition_cursors x SET cursor = {BACKLOG // 2} FROM conveyor.partitions p
             WHERE p.id = x.partition_id AND p.name = 'c' AND x.consumer_group = '__QUEUE_MODE__'""")
    run("SELECT conveyor.stream_create('events')")
    run("SELECT conveyor.stream_subscribe('events', 'reader')")
    table, seq = run("SELECT table_name, event_seq FROM conveyor.stream_current_table('events')").fetchone()
    for _ in range(BACKLOG // 500):  # ticks of 500 events, each burst in its own transaction
        run(f"INSERT INTO {table} (ev_id, ev_type, ev_data) SELECT nextval('{seq}'), 't', 'x' "
            "FROM generate_series(1, 500)")
        run("SELECT conveyor.stream_force_tick('events')")


@pytest.fixture(scope="module", params=["never analyzed", "analyzed before the burst", "analyzed"])
def backlog_dsn(request: pytest.FixtureRequest, backlog_template: str) -> Iterator[str]:
    """The backlog, with the tables never analyzed; analyzed when they held only another
    queue's and partition's messages (statistics that have not seen the queues at hand); or
    analyzed after the burst."""
    name = unique_name("conveyor_backlog")
    dsn = create_database(name, template=backlog_template)
    with psycopg.connect(dsn, autocommit=True) as sql:
        for table in ("messages_shared", "archive_shared", "partition_messages"):
            sql.execute(f"ALTER TABLE conveyor.{table} SET (autovacuum_enabled = false)".encode())
        if request.param == "analyzed before the burst":
            sql.execute("SELECT conveyor.queue_create('earlier')")
            sql.execute("SELECT conveyor.message_send_batch('earlier', array_fill('x'::text, ARRAY[1000]))")
            sql.execute("SELECT conveyor.pqueue_push(%s::jsonb)", (Jsonb([{"queue": "earlier", "payload": k}
                                                                         for k in range(1000)]),))
            sql.execute("ANALYZE")
        _load_backlog(sql)
        if request.param == "analyzed":
            sql.execute("ANALYZE")
    yield dsn
    drop_database(name)


@pytest.fixture
def backlog(backlog_dsn: str) -> Iterator[psycopg.Connection]:
    """A session of its own: the first calls of a session are planned afresh (the plans a
    function keeps are per session)."""
    with psycopg.connect(backlog_dsn, autocommit=True) as sql:
        yield sql


def _read(sql: psycopg.Connection) -> int:
    """Index entries and sequentially scanned rows read so far in this transaction, over
    every table and index of Conveyor's schemas (partitions, stream tables included)."""
    return sql.execute("""SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(c.oid)), 0)::bigint
                            FROM pg_class c
                           WHERE c.relnamespace IN ('conveyor'::regnamespace, 'pgmq'::regnamespace)
                             AND c.relkind IN ('r', 'p', 'i', 'I')""").fetchone()[0]


def _rows(sql: psycopg.Connection, query: str, params: object = ()) -> list[tuple]:
    return sql.execute(query.encode(), params).fetchall()


def _pq(sql: psycopg.Connection, function: str, arg: object) -> Any:
    return sql.execute(f"SELECT conveyor.{function}(%s::jsonb)".encode(), (Jsonb(arg),)).fetchone()[0]


def _received(sql: psycopg.Connection, queue: str = "jobs", qty: int = 10) -> list[tuple]:
    return _rows(sql, "SELECT id, receive_count FROM conveyor.message_receive(%s, 300, %s)", (queue, qty))


def _popped(sql: psycopg.Connection, request: dict) -> list[dict]:
    return _pq(sql, "pqueue_pop", request)["messages"]


def _acks(messages: list[dict], status: str = "completed") -> list[dict]:
    return [{"transactionId": m["transactionId"], "partitionId": m["partitionId"], "leaseId": m["leaseId"],
             "status": status} for m in messages]


def _batch(sql: psycopg.Connection) -> int:
    return sql.execute("SELECT conveyor.stream_next_batch('events', 'reader')").fetchone()[0]


# Each hot call: (what it needs prepared, outside the count) -> (the call, inside it) -> messages handled.
HOT: dict[str, Callable[[psycopg.Connection], Callable[[], int]]] = {
    "receive": lambda sql: lambda: len(_received(sql)),
    "receive, max_receive_count": lambda sql: lambda: len(_received(sql, "limited")),
    "receive, another queue's backlog": lambda sql: (
        sql.execute("SELECT conveyor.message_send_batch('small', array_fill('x'::text, ARRAY[10]))"),
        lambda: len(_received(sql, "small")))[1],
    "pop": lambda sql: lambda: len(_rows(sql, "SELECT id FROM conveyor.message_pop('jobs', 10)")),
    "send": lambda sql: lambda: len(_rows(sql, "SELECT * FROM conveyor.message_send_json('jobs', %s::jsonb)",
                                          (Jsonb([{"body": "x"}] * 10),))),
    "delete by receipt": lambda sql: (lambda got: lambda: len(_rows(
        sql, "SELECT conveyor.message_delete('jobs', %s::bigint[], %s::integer[])",
        ([r[0] for r in got], [r[1] for r in got]))))(_received(sql)),
    "delete by id": lambda sql: (lambda got: lambda: len(_rows(
        sql, "SELECT conveyor.message_delete('jobs', %s::bigint[])", ([r[0] for r in got],))))(_received(sql)),
    "archive by receipt": lambda sql: (lambda got: lambda: len(_rows(
        sql, "SELECT conveyor.message_archive('jobs', %s::bigint[], %s::integer[])",
        ([r[0] for r in got], [r[1] for r in got]))))(_received(sql)),
    "change visibility by receipt": lambda sql: (lambda got: lambda: len(_rows(
        sql, "SELECT id FROM conveyor.message_set_vt('jobs', %s::bigint[], %s::integer[], 600, true)",
        ([r[0] for r in got], [r[1] for r in got]))))(_received(sql)),
    "fail by receipt": lambda sql: (lambda got: lambda: int(_rows(
        sql, "SELECT conveyor.message_fail('limited', %s, 'no', %s)", got[0])[0][0]))(_received(sql, "limited", 1)),
    # (groups are left with nothing in flight: vt 0)
    "FIFO receive": lambda sql: lambda: len(_rows(sql, "SELECT id FROM conveyor.message_receive('jobs.fifo', 0, 10)")),
    "FIFO receive with an attempt id": lambda sql: lambda: len(_rows(
        sql, "SELECT id FROM conveyor.message_receive_attempt('jobs.fifo', %s, 0, 10)", (uuid.uuid4().hex,))),
    "FIFO receive retried with its attempt id": lambda sql: (lambda attempt: (
        _rows(sql, "SELECT id FROM conveyor.message_receive_attempt('jobs.fifo', %s, 0, 10)", (attempt,)),
        lambda: len(_rows(sql, "SELECT id FROM conveyor.message_receive_attempt('jobs.fifo', %s, 0, 10)",
                          (attempt,))))[1])(uuid.uuid4().hex),
    "grouped receive": lambda sql: lambda: len(_rows(
        sql, "SELECT id FROM conveyor.message_receive_fifo('grouped', 0, 10)")),
    "pgmq read": lambda sql: lambda: len(_rows(sql, "SELECT msg_id FROM pgmq.read('pg', 300, 10)")),
    "pgmq pop": lambda sql: lambda: len(_rows(sql, "SELECT msg_id FROM pgmq.pop('pg', 10)")),
    "pgmq send": lambda sql: lambda: len(_rows(sql, "SELECT pgmq.send_batch('pg', array_fill('1'::jsonb, ARRAY[10]))")),
    "pgmq delete": lambda sql: (lambda got: lambda: len(_rows(sql, "SELECT pgmq.delete('pg', %s::bigint[])", (got,))))(
        [r[0] for r in _rows(sql, "SELECT msg_id FROM pgmq.read('pg', 300, 10)")]),
    "pgmq archive": lambda sql: (lambda got: lambda: len(_rows(sql, "SELECT pgmq.archive('pg', %s::bigint[])", (got,))))(
        [r[0] for r in _rows(sql, "SELECT msg_id FROM pgmq.read('pg', 300, 10)")]),
    "pgmq set_vt": lambda sql: (lambda got: lambda: len(_rows(sql, "SELECT msg_id FROM pgmq.set_vt('pg', %s::bigint[], 60)",
                                                              (got,))))(
        [r[0] for r in _rows(sql, "SELECT msg_id FROM pgmq.read('pg', 300, 10)")]),
    "partitioned queue: pop a partition, ack": lambda sql: lambda: len(_pq(sql, "pqueue_ack", _acks(
        _popped(sql, {"queue": "pq", "partition": "a", "batch": 10})))),
    "partitioned queue: pop any partition, ack": lambda sql: lambda: len(_pq(sql, "pqueue_ack", _acks(
        _popped(sql, {"queue": "pq", "batch": 10})))),
    "partitioned queue: ack": lambda sql: (lambda got: lambda: len(_pq(sql, "pqueue_ack", _acks(got))))(
        _popped(sql, {"queue": "pq", "partition": "c", "batch": 10})),
    "partitioned queue: ack failed": lambda sql: (lambda got: lambda: len(_pq(sql, "pqueue_ack", _acks(got, "failed"))))(
        _popped(sql, {"queue": "pq", "partition": "b", "batch": 10})),
    "partitioned queue: renew, ack": lambda sql: (lambda got: lambda: (
        _pq(sql, "pqueue_renew", [{"leaseId": got[0]["leaseId"]}]), len(_pq(sql, "pqueue_ack", _acks(got))))[1])(
        _popped(sql, {"queue": "pq", "partition": "b", "batch": 10})),
    "partitioned queue: push one": lambda sql: lambda: len(_pq(sql, "pqueue_push", [
        {"queue": "pq", "partition": "a", "payload": 1, "transactionId": uuid.uuid4().hex}])),
    "partitioned queue: push": lambda sql: lambda: len(_pq(sql, "pqueue_push", [
        {"queue": "pq", "partition": "a", "payload": 1, "transactionId": uuid.uuid4().hex} for _ in range(10)])),
    "stream: next batch, its events, ack": lambda sql: lambda: (
        lambda batch: (len(_rows(sql, "SELECT * FROM conveyor.stream_get_batch_events(%s)", (batch,))),
                       sql.execute("SELECT conveyor.stream_ack(%s)", (batch,)))[0])(_batch(sql)),
    "stream: receive and ack": lambda sql: lambda: (
        lambda got: (len(got), sql.execute("SELECT conveyor.stream_ack(%s)", (got[0][1],)))[0])(
        _rows(sql, "SELECT id, batch_id FROM conveyor.stream_receive('events', 'reader', 1000)")),
    "move task: one step": lambda sql: (
        sql.execute("SELECT conveyor.move_task_cancel(t.handle) FROM conveyor.move_tasks t WHERE t.status = 'RUNNING'"),
        sql.execute("SELECT conveyor.move_task_start('graveyard', NULL, 10)"),
        lambda: int(_rows(sql, "SELECT conveyor.move_task_step(1000)")[0][0]))[2],
    "stream: send": lambda sql: lambda: len(_rows(
        sql, "SELECT conveyor.stream_send_batch('events', 't', array_fill('x'::text, ARRAY[10]))")),
}


# The few rows every call updates (a partitioned queue's cursor, a FIFO group, a stream
# consumer) leave dead versions that each lookup of them reads until autovacuum removes
# them: that cost follows the calls since the last vacuum, not the backlog, so these small
# tables are vacuumed (not analyzed) before each call.
HOT_ROWS = ("queues", "message_groups", "receive_attempts", "pqueues", "partitions", "consumer_groups",
            "partition_cursors", "partition_retries", "stream_consumers", "stream_ticks", "move_tasks")


@pytest.mark.parametrize("call", list(HOT))
def test_hot_calls_read_a_bounded_number_of_rows_per_message_whatever_the_backlog(backlog, call):
    """Each call three times in a new session, each in its own transaction."""
    for _ in range(3):
        run = HOT[call](backlog)
        backlog.execute(("VACUUM " + ", ".join(f"conveyor.{t}" for t in HOT_ROWS)).encode())
        with backlog.transaction():
            before = _read(backlog)
            handled = run()
            read = _read(backlog) - before
        assert handled > 0, f"{call} handled nothing: the test is not testing"
        assert read <= PER_CALL + PER_MESSAGE * handled, (
            f"{call}: {read} index entries and rows read for {handled} messages, with {BACKLOG} waiting")


async def test_the_per_message_checks_are_planned_once_per_session(conn):
    """conveyor._message_ok runs for every message of every send, inlined into the INSERT.
    A LANGUAGE sql function it calls that cannot be inlined (one with a subquery) would be
    planned again on every execution of the send (0022's _headers_size did: ~60 us of
    PostgreSQL CPU per call, headers or not), so every helper it calls is plpgsql (plans
    kept for the session) or a plain SQL expression that inlines."""
    cur = await conn.execute("SELECT prosrc FROM pg_proc WHERE oid = 'conveyor._message_ok'::regproc")
    body = (await cur.fetchone())[0]
    helpers = sorted(set(re.findall(r"conveyor\.(_\w+)\(", body)))
    assert "_headers_size" in helpers
    for name in helpers:
        cur = await conn.execute("SELECT l.lanname, p.prosrc FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
                                 "WHERE p.oid = %s::regproc", (f"conveyor.{name}",))
        language, source = await cur.fetchone()
        assert language == "plpgsql" or (language == "sql" and not re.search(r"\bfrom\b", source, re.I)), \
            f"conveyor.{name} ({language}) is planned on every call of a send"


async def test_the_partitioned_queues_calls_keep_their_plans_for_the_session(conn):
    """A LANGUAGE sql function with SET clauses (SECURITY DEFINER's search_path) is never
    inlined, and on this PostgreSQL its statement is planned again on every call:
    pqueue_pop_many, the server's one call per fused pop, was (0025's lesson for the
    per-message checks). Every function of the partitioned queues' API is plpgsql."""
    cur = await conn.execute("SELECT p.proname, l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
                             "WHERE p.pronamespace = 'conveyor'::regnamespace AND p.proname LIKE 'pqueue\\_%' "
                             "AND p.prosecdef ORDER BY 1")
    found = await cur.fetchall()
    assert ("pqueue_pop_many", "plpgsql") in found
    assert [name for name, language in found if language == "sql"] == []


def _blocks(sql: psycopg.Connection) -> int:
    """Buffer pages of Conveyor's tables and indexes visited so far in this transaction."""
    return sql.execute("""SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::bigint
                            FROM pg_class c WHERE c.relnamespace = 'conveyor'::regnamespace""").fetchone()[0]


# a FIFO receive of 10 over GROUPS groups: the group probes and a lookup by key per message
FIFO_RECEIVE_BLOCKS = 400


def test_a_fifo_receive_locks_its_messages_by_key_whatever_the_statistics(backlog):
    """The FIFO claim locks its candidates by key. Written as `id = ANY (...) AND vt <= ts`,
    a generic plan without statistics walked the visibility index over every visible
    message of the queue to find them (index entries the row count above does not see,
    since only the matching ones are returned): pages visited grew with the backlog."""
    for _ in range(3):
        with backlog.transaction():
            before = _blocks(backlog)
            got = _received(backlog, "jobs.fifo")
            visited = _blocks(backlog) - before
        assert got, "nothing received: the test is not testing"
        assert visited <= FIFO_RECEIVE_BLOCKS, f"{visited} pages visited for a FIFO receive of {len(got)}"



async def test_queue_metrics_scan_each_queue_once(conn):
    """A queue's figures are one scan of its messages, for one queue and for all: the form
    ``(conveyor._metrics(q)).*`` ran the function once per column (ten scans; 2 s a scrape
    at a million messages waiting)."""
    for name in ("a", "b", "c"):
        await queues.create(conn, name)
    async with conn.transaction():  # the transaction's own function counts
        await conn.execute("SET LOCAL track_functions = 'all'")

        async def calls() -> int:
            cur = await conn.execute("SELECT coalesce(sum(calls), 0)::int FROM pg_stat_xact_user_functions "
                                     "WHERE schemaname = 'conveyor' AND funcname = '_metrics'")
            return (await cur.fetchone())[0]

        rows = await (await conn.execute("SELECT * FROM conveyor.queue_metrics_all()")).fetchall()
        assert len(rows) == 3 and await calls() == 3
        one = await (await conn.execute("SELECT * FROM conveyor.queue_metrics('b')")).fetchall()
        assert [r[0] for r in one] == ["b"] and await calls() == 4


async def _table_rows_read(conn, table: str) -> int:
    """Rows of sequential scans and index entries read in ``conveyor.<table>`` so far in
    this transaction."""
    cur = await conn.execute("SELECT pg_stat_get_xact_tuples_returned(%s::regclass) "
                             "+ coalesce(sum(pg_stat_get_xact_tuples_returned(x.indexrelid)), 0)::bigint "
                             "FROM pg_index x WHERE x.indrelid = %s::regclass", (f"conveyor.{table}",) * 2)
    return (await cur.fetchone())[0]


async def test_a_wildcard_pop_reads_its_own_groups_cursors_only(conn):
    """A pop that names no partition looks up its group's cursor of each candidate
    partition: one index entry each (100 partitions holding work here). A join the
    planner may turn into a hash of every cursor of every group (20 groups here) would read
    them all, on every pop."""
    await conn.execute("""SELECT conveyor.pqueue_push(jsonb_agg(jsonb_build_object(
                              'queue', 'wide', 'partition', 'p' || (g % 100), 'payload', g)))
                            FROM generate_series(1, 1000) g""")
    await conn.execute("""INSERT INTO conveyor.partition_cursors (partition_id, consumer_group, queue_id)
                          SELECT p.id, 'group' || g, p.queue_id FROM conveyor.partitions p, generate_series(1, 20) g""")
    await conn.execute("ANALYZE conveyor.partitions, conveyor.partition_cursors")
    for _ in range(8):  # past the custom plans
        async with conn.transaction():
            before = await _table_rows_read(conn, "partition_cursors")
            cur = await conn.execute("""SELECT conveyor.pqueue_pop('{"queue": "wide", "batch": 2}')""")
            got = (await cur.fetchone())[0]["messages"]
            read = await _table_rows_read(conn, "partition_cursors") - before
        assert len(got) == 2
        assert read < 400, f"{read} cursor rows read by a pop over 100 partitions, with 2,000 cursors of other groups"


async def _popped_reading(conn, request: str) -> tuple[list, int]:
    """A pop in its own transaction: its messages, and the partitions' and cursors' rows
    and index entries it read."""
    tables = ("partitions", "partition_cursors")
    async with conn.transaction():
        before = sum([await _table_rows_read(conn, t) for t in tables])
        cur = await conn.execute("SELECT conveyor.pqueue_pop(%s::jsonb)", (request,))
        got = (await cur.fetchone())[0]["messages"]
        return got, sum([await _table_rows_read(conn, t) for t in tables]) - before


async def test_a_wildcard_pop_reads_a_page_of_the_partitions_holding_work(conn):
    """A pop that names no partition reads its candidates in pages, in the order of an
    index (the oldest push first), and stops at the end of a page: the partitions and
    cursors it reads are bounded, not the partitions holding work (1,000 here, half of
    them left behind by the group). The whole list cost 3.7 ms a pop at 1,024 partitions
    against 0.9 at 64."""
    await conn.execute("""SELECT conveyor.pqueue_push(jsonb_agg(jsonb_build_object(
                              'queue', 'wide', 'partition', 'p' || (g % 1000), 'payload', g)))
                            FROM generate_series(1, 3000) g""")
    await conn.execute("""INSERT INTO conveyor.partition_cursors (partition_id, consumer_group, queue_id, behind)
                          SELECT p.id, '__QUEUE_MODE__', p.queue_id, true FROM conveyor.partitions p
                           WHERE p.name ~ '[02468]$'""")
    # (vacuumed: the push's earlier versions of the partitions' rows are index entries each
    # scan reads until it or a vacuum marks them dead; that follows the writes, not the pop)
    await conn.execute("VACUUM ANALYZE conveyor.partitions, conveyor.partition_cursors")
    for _ in range(8):  # past the custom plans
        got, read = await _popped_reading(conn, '{"queue": "wide", "batch": 10}')
        assert len(got) == 3
        assert read < 200, f"{read} partitions and cursors read by a pop, with 1,000 partitions holding work"


@pytest.mark.own_cluster  # the mark moves only below the oldest transaction running anywhere on the server
async def test_a_wildcard_pop_does_not_walk_the_partitions_its_group_drained(conn):
    """Partitions pushed by one transaction share its mark, so the group's watermark cannot
    pass the drained ones by transaction id alone, and pops that keep finding work never
    move it: each pop walked every drained partition before it found a page with work
    (1,271 us a pop with a few hundred of 1,024 drained). The mark is a key of the walk's
    order, moved up to the first partition with work by the pops that find it."""
    await conn.execute("""SELECT conveyor.pqueue_push(jsonb_agg(jsonb_build_object(
                              'queue', 'drained', 'partition', 'p' || (g % 600), 'payload', g)))
                            FROM generate_series(1, 1200) g""")
    for _ in range(4):  # 400 partitions drained, in the order pops take them
        cur = await conn.execute("""SELECT conveyor.pqueue_pop(
                                      '{"queue": "drained", "batch": 200, "maxPartitions": 100, "autoAck": true}')""")
        assert len((await cur.fetchone())[0]["messages"]) == 200
    # while a transaction below a partition's push mark is running, a push may still commit
    # with the same mark, so the watermark may not pass any partition so marked: waited out
    await xmin.past_pushes(conn)
    await conn.execute("VACUUM ANALYZE conveyor.partitions, conveyor.partition_cursors, conveyor.consumer_groups")
    pop = '{"queue": "drained", "batch": 2, "autoAck": true}'
    await _popped_reading(conn, pop)  # walks the drained partitions once, and moves the mark past them
    for _ in range(8):
        got, read = await _popped_reading(conn, pop)
        assert len(got) == 2
        assert read < 200, f"{read} partitions and cursors read by a pop, with 400 of 600 partitions drained"


async def test_a_pop_finds_its_queue_by_name_among_many(conn):
    """A pop naming its queue looks it up by its key: one condition with an OR for the
    namespace and task pops read every partitioned queue for each pop (2,000 here)."""
    await conn.execute("INSERT INTO conveyor.pqueues (name) SELECT 'other-' || g FROM generate_series(1, 2000) g")
    await conn.execute("""SELECT conveyor.pqueue_push('[{"queue": "mine", "payload": 1}, {"queue": "mine", "payload": 2}]')""")
    await conn.execute("ANALYZE conveyor.pqueues")
    for _ in range(2):
        async with conn.transaction():
            before = await _table_rows_read(conn, "pqueues")
            cur = await conn.execute("""SELECT conveyor.pqueue_pop('{"queue": "mine", "autoAck": true}')""")
            assert len((await cur.fetchone())[0]["messages"]) == 1
            read = await _table_rows_read(conn, "pqueues") - before
        assert read < 20, f"{read} partitioned queues read by a pop, with 2,001 of them"
