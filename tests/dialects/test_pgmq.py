"""Conveyor's pgmq dialect (src/conveyor/sql/dialects/pgmq, docs/dialects/pgmq.md).

Proof by pgmq's own clients, unmodified: the `pgmq` Python client (PyPI, pinned in the
test extra) and pgmq-js (npm, tests/dialects/pgmq_js); and by comparison with the real
pgmq, installed from the SQL its Python package ships into a database of its own: the
same calls must answer the same rows and the same errors. Then what only Conveyor has to
show: a pgmq queue is a Conveyor queue, read through SQS by boto3 against a real server.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from pgmq import Message, QueueMetrics, QueueRecord, SyncPGMQueue

from conftest import Databases, create_database, drop_database, unique_name
from dialects import pgmq_support
from support import sqs_clients
from support.server import ServerProcess

DOC = Path(__file__).parents[2] / "docs" / "dialects" / "pgmq.md"


@pytest.fixture(scope="module")
def pgmq_template(template_db: str) -> Iterator[str]:
    """Conveyor's schema with the pgmq dialect installed, cloned per test."""
    name = unique_name("conveyor_pgmq_tpl")
    pgmq_support.install_dialect(create_database(name, template=template_db))
    yield name
    drop_database(name)


@pytest.fixture
def db(pgmq_template: str, databases: Databases) -> Iterator[str]:
    name = unique_name("conveyor_pgmq")
    yield create_database(name, template=pgmq_template)
    databases.drop_later(name)  # off the test's path


@pytest.fixture
def sql(db: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def real_db() -> Iterator[str]:
    """The real pgmq (plain-SQL install), for side-by-side answers."""
    name = unique_name("conveyor_realpgmq")
    dsn = create_database(name)
    pgmq_support.install_real_pgmq(dsn)
    yield dsn
    drop_database(name)


@pytest.fixture
def q() -> str:
    return f"q_{uuid.uuid4().hex[:10]}"


@contextlib.contextmanager
def sqlstate(code: str, match: str) -> Iterator[None]:
    """The statement fails with this SQLSTATE (Conveyor's own CV codes too) and message."""
    with pytest.raises(psycopg.Error, match=match) as caught:
        yield
    assert caught.value.sqlstate == code


def scalar(conn: psycopg.Connection, query: str, params: tuple[object, ...] = ()) -> object:
    row = conn.execute(query.encode(), params).fetchone()
    return row[0] if row else None


# -- the pgmq Python client, unmodified --------------------------------------------------

def test_python_client(db: str, q: str) -> None:
    client = SyncPGMQueue(conn_string=db, init_extension=False, pool_size=2)
    try:
        client.create_queue(q)
        client.create_queue(q + "_u", unlogged=True)
        client.create_partitioned_queue(q + "_p", partition_interval="1 day", retention_interval="7 days")
        with pytest.warns(UserWarning):
            listed = {r.queue_name: r for r in client.list_queues()}
        assert isinstance(listed[q], QueueRecord)
        assert (listed[q].is_unlogged, listed[q].is_partitioned) == (False, False)
        assert (listed[q + "_u"].is_unlogged, listed[q + "_p"].is_partitioned) == (True, True)

        first = client.send(q, {"n": 1}, headers={"trace": "t1"})
        later = client.send(q, {"n": 2}, delay=600)
        at = client.send(q, {"n": 3}, delay=datetime.now(UTC) + timedelta(hours=1))
        batch = client.send_batch(q, [{"n": 4}, {"n": 5}, {"n": 6}])
        assert [first, later, at, *batch] == [1, 2, 3, 4, 5, 6]

        one = client.read(q, vt=30)
        assert isinstance(one, Message)
        assert (one.msg_id, one.read_ct, one.message, one.headers) == (1, 1, {"n": 1}, {"trace": "t1"})
        assert one.last_read_at is not None and one.vt > one.last_read_at
        many = client.read(q, vt=30, qty=10)
        assert [m.msg_id for m in many] == [4, 5, 6]
        assert client.read_with_poll(q, vt=30, qty=5, max_poll_seconds=1, poll_interval_ms=50) == []

        again = client.set_vt(q, 1, 0)
        assert again.msg_id == 1 and again.vt <= datetime.now(UTC)
        assert [m.msg_id for m in client.set_vt(q, [4, 5], 0)] == [4, 5]
        assert client.set_vt(q, 6, datetime.now(UTC) - timedelta(seconds=1)).msg_id == 6
        reread = client.read_with_poll(q, vt=30, qty=1, max_poll_seconds=2)
        assert [(m.msg_id, m.read_ct) for m in reread] == [(1, 2)]

        popped = client.pop(q)
        assert (popped.msg_id, popped.read_ct, popped.message) == (4, 1, {"n": 4})
        assert [m.msg_id for m in client.pop(q, qty=5)] == [5, 6]

        assert client.archive(q, 1) is True and client.archive(q, 1) is False
        assert client.archive_batch(q, [2, 999]) == [2]
        assert client.delete(q, 3) is True and client.delete(q, 3) is False
        assert client.delete_batch(q, [999]) == []

        client.send_batch(q, [{"n": 7}, {"n": 8}], headers=[{"h": 1}, {"h": 2}], delay=0)
        metrics = client.metrics(q)
        assert isinstance(metrics, QueueMetrics)
        assert (metrics.queue_name, metrics.queue_length, metrics.total_messages, metrics.queue_visible_length) \
            == (q, 2, 8, 2)
        assert {m.queue_name for m in client.metrics_all()} >= {q, q + "_u", q + "_p"}
        assert client.purge(q) == 2
        assert client.metrics(q).queue_length == 0

        assert client.drop_queue(q) is True
        assert client.drop_queue(q) is False
        with pytest.raises(psycopg.errors.UndefinedTable, match=f'relation "pgmq.q_{q}" does not exist'):
            client.send(q, {"n": 0})
    finally:
        client.close()


# -- pgmq-js, unmodified -----------------------------------------------------------------

def test_pgmq_js_answers_as_against_real_pgmq(db: str, real_db: str, q: str) -> None:
    pgmq_support.npm_ci()
    ours = pgmq_support.run_js(db, q)
    theirs = pgmq_support.run_js(real_db, q)
    assert ours == theirs
    assert ours["sent"] == [1, 2, 3, 4]
    assert [m["msgId"] for m in ours["readBatch"]] == [1, 2, 3]
    assert ours["list"][1] == {"name": q + "_unlogged", "isUnlogged": True, "isPartitioned": False,
                               "createdAtIsDate": True}
    # pgmq-js sends set_vt's arguments untyped, which pgmq 1.13's overloads make ambiguous:
    # the real pgmq refuses the call just the same
    assert ours["setVt"]["code"] == "42725"


# -- the same SQL, the same answers as the real pgmq --------------------------------------

SIDE_BY_SIDE = [
    ("SELECT pgmq.create(%s)", ("{q}",)),
    ("SELECT pgmq.create(%s)", ("{q}",)),
    ("SELECT * FROM pgmq.send(%s, %s::jsonb)", ("{q}", '{"a": 1}')),
    ("SELECT * FROM pgmq.send(%s, %s::jsonb, %s::jsonb)", ("{q}", '{"a": 2}', '{"h": "1"}')),
    ("SELECT * FROM pgmq.send(%s, %s::jsonb, 60)", ("{q}", '{"a": 3}')),
    ("SELECT * FROM pgmq.send(%s, %s::jsonb, now() + interval '1 hour')", ("{q}", "[1, 2]")),
    ("SELECT * FROM pgmq.send(%s, %s::jsonb, %s::jsonb, 0)", ("{q}", '"text"', '{"h": "2"}')),
    ("SELECT * FROM pgmq.send_batch(%s, ARRAY['{\"b\": 1}', '{\"b\": 2}']::jsonb[])", ("{q}",)),
    ("SELECT * FROM pgmq.send_batch(%s, ARRAY['1', '2']::jsonb[], ARRAY['{\"x\": 1}', '{\"x\": 2}']::jsonb[])",
     ("{q}",)),
    ("SELECT * FROM pgmq.send_batch(%s, ARRAY['{}']::jsonb[], 30)", ("{q}",)),
    ("SELECT * FROM pgmq.send_batch(%s, ARRAY[]::jsonb[])", ("{q}",)),
    ("SELECT * FROM pgmq.send_batch(%s, ARRAY['1']::jsonb[], ARRAY['{}', '{}']::jsonb[])", ("{q}",)),
    ("SELECT * FROM pgmq.read(%s, 30, 0)", ("{q}",)),
    ("SELECT * FROM pgmq.read(%s, 30, -1)", ("{q}",)),
    ("SELECT * FROM pgmq.read(%s, 30, 20) ORDER BY msg_id", ("{q}",)),
    ("SELECT * FROM pgmq.read(%s, 30, 20)", ("{q}",)),
    ("SELECT * FROM pgmq.read_with_poll(%s, 30, 5, 1, 100)", ("{q}",)),
    ("SELECT * FROM pgmq.set_vt(%s, 1, 0)", ("{q}",)),
    ("SELECT * FROM pgmq.set_vt(%s, 999, 0)", ("{q}",)),
    ("SELECT * FROM pgmq.read(%s, 30, 1)", ("{q}",)),
    ("SELECT * FROM pgmq.set_vt(%s, ARRAY[2, 6]::bigint[], 0) ORDER BY msg_id", ("{q}",)),
    ("SELECT * FROM pgmq.set_vt(%s, 7::bigint, now() - interval '1 second')", ("{q}",)),
    ("SELECT * FROM pgmq.pop(%s)", ("{q}",)),
    ("SELECT * FROM pgmq.pop(%s, 10) ORDER BY msg_id", ("{q}",)),
    ("SELECT * FROM pgmq.pop(%s)", ("{q}",)),
    ("SELECT pgmq.archive(%s, 1::bigint), pgmq.archive(%s, 1::bigint)", ("{q}", "{q}")),
    ("SELECT * FROM pgmq.archive(%s, ARRAY[8, 999]::bigint[])", ("{q}",)),
    ("SELECT pgmq.delete(%s, 3::bigint), pgmq.delete(%s, 3::bigint)", ("{q}", "{q}")),
    ("SELECT * FROM pgmq.delete(%s, ARRAY[4, 999]::bigint[])", ("{q}",)),
    ("SELECT msg_id, read_ct, message, headers FROM pgmq.q_{q} ORDER BY msg_id", ()),
    ("SELECT msg_id, read_ct, message, headers FROM pgmq.a_{q} ORDER BY msg_id", ()),
    ("SELECT queue_name, queue_length, total_messages, queue_visible_length, default_partition_length"
     " FROM pgmq.metrics(%s)", ("{q}",)),
    ("SELECT queue_name, is_partitioned, is_unlogged FROM pgmq.list_queues() WHERE queue_name = %s", ("{q}",)),
    ("SELECT pgmq.purge_queue(%s)", ("{q}",)),
    ("SELECT * FROM pgmq.read(%s, 30, 1)", ("{q}_nope",)),
    ("SELECT * FROM pgmq.read_with_poll(%s, 30, 1, 1)", ("{q}_nope",)),
    ("SELECT * FROM pgmq.send(%s, '1')", ("{q}_nope",)),
    ("SELECT * FROM pgmq.send_batch(%s, ARRAY['1']::jsonb[])", ("{q}_nope",)),
    ("SELECT * FROM pgmq.pop(%s)", ("{q}_nope",)),
    ("SELECT pgmq.archive(%s, 1::bigint)", ("{q}_nope",)),
    ("SELECT pgmq.delete(%s, ARRAY[1]::bigint[])", ("{q}_nope",)),
    ("SELECT * FROM pgmq.set_vt(%s, 1, 1)", ("{q}_nope",)),
    ("SELECT * FROM pgmq.metrics(%s)", ("{q}_nope",)),
    ("SELECT pgmq.purge_queue(%s)", ("{q}_nope",)),
    ("SELECT * FROM pgmq.read(%s, 30, 1)", ("bad;name",)),
    ("SELECT pgmq.create(%s)", ("bad$name",)),
    ("SELECT pgmq.create(%s)", ("x" * 48,)),
    ("SELECT pgmq.validate_queue_name(%s)", ("x" * 48,)),
    ("SELECT pgmq.format_table_name(%s, 'q')", ("MixedCase",)),
    ("SELECT pgmq.detach_archive(%s)", ("{q}",)),
    ("SELECT pgmq.drop_queue(%s)", ("{q}_nope",)),
    ("SELECT pgmq.drop_queue(%s)", ("{q}",)),
    ("SELECT pgmq.drop_queue(%s)", ("{q}",)),
    ("SELECT count(*) FROM pgmq.list_queues() WHERE queue_name = %s", ("{q}",)),
]


def test_same_answers_as_real_pgmq(sql: psycopg.Connection, real_db: str, q: str) -> None:
    with psycopg.connect(real_db, autocommit=True) as real:
        for statement, params in SIDE_BY_SIDE:
            query = statement.replace("{q}", q)
            bound = tuple(p.replace("{q}", q) for p in params)
            ours, theirs = pgmq_support.outcome(sql, query, bound), pgmq_support.outcome(real, query, bound)
            assert ours == theirs, query


# -- semantics and errors -----------------------------------------------------------------

def test_read_ct_and_visibility(sql: psycopg.Connection, q: str) -> None:
    sql.execute("SELECT pgmq.create(%s)", (q,))
    sql.execute("SELECT pgmq.send(%s, '{\"job\": 1}')", (q,))
    first = sql.execute("SELECT msg_id, read_ct, vt - last_read_at FROM pgmq.read(%s, 1, 1)", (q,)).fetchone()
    assert first == (1, 1, timedelta(seconds=1))
    assert sql.execute("SELECT * FROM pgmq.read(%s, 1, 1)", (q,)).fetchall() == []
    time.sleep(1.1)
    assert sql.execute("SELECT msg_id, read_ct FROM pgmq.read(%s, 0, 1)", (q,)).fetchall() == [(1, 2)]
    # vt 0 (and a negative vt, as in pgmq) leaves it visible at once
    assert sql.execute("SELECT msg_id, read_ct FROM pgmq.read(%s, -5, 1)", (q,)).fetchall() == [(1, 3)]
    assert sql.execute("SELECT read_ct FROM pgmq.q_" + q).fetchall() == [(3,)]


def test_delays_beyond_a_send(sql: psycopg.Connection, q: str) -> None:
    sql.execute("SELECT pgmq.create(%s)", (q,))
    # Conveyor's send delays up to 900 s; the dialect sets longer ones in the same call
    mid = scalar(sql, "SELECT * FROM pgmq.send(%s, '1', 3600)", (q,))
    hidden = scalar(sql, "SELECT vt - now() FROM pgmq.q_" + q + " WHERE msg_id = %s", (mid,))
    assert timedelta(seconds=3590) < hidden <= timedelta(seconds=3601)  # type: ignore[operator]
    with sqlstate("CVV01", "at most 43200 seconds"):
        sql.execute("SELECT * FROM pgmq.send(%s, '1', 50000)", (q,))
    with sqlstate("CVV01", "vt must be from 0 to 43200"):
        sql.execute("SELECT * FROM pgmq.read(%s, 50000, 1)", (q,))


def test_batches_larger_than_the_engine_takes_at_once(sql: psycopg.Connection, q: str) -> None:
    sql.execute("SELECT pgmq.create(%s)", (q,))
    ids = sql.execute("SELECT * FROM pgmq.send_batch(%s, array_fill('{}'::jsonb, ARRAY[10050]))", (q,)).fetchall()
    assert [i for (i,) in ids] == list(range(1, 10051))
    assert scalar(sql, "SELECT count(*) FROM pgmq.read(%s, 30, 2500)", (q,)) == 2500
    assert scalar(sql, "SELECT count(*) FROM pgmq.pop(%s, 1500)", (q,)) == 1500
    assert scalar(sql, "SELECT count(*) FROM pgmq.read(%s, 30, NULL)", (q,)) == 10050 - 4000


def test_read_with_poll_waits_for_a_send(sql: psycopg.Connection, db: str, q: str) -> None:
    sql.execute("SELECT pgmq.create(%s)", (q,))
    started = time.monotonic()
    assert sql.execute("SELECT * FROM pgmq.read_with_poll(%s, 30, 1, 1, 50)", (q,)).fetchall() == []
    assert 0.9 < time.monotonic() - started < 3

    def send_later() -> None:
        time.sleep(0.5)
        with psycopg.connect(db, autocommit=True) as other:
            other.execute("SELECT pgmq.send(%s, '{\"late\": true}')", (q,))

    sender = threading.Thread(target=send_later)
    sender.start()
    started = time.monotonic()
    rows = sql.execute("SELECT msg_id, message FROM pgmq.read_with_poll(%s, 30, 5, 5, 50)", (q,)).fetchall()
    sender.join()
    assert rows == [(1, {"late": True})]
    assert time.monotonic() - started < 3


def test_sends_wake_long_pollers_only_while_listened(sql: psycopg.Connection, db: str, q: str) -> None:
    """pgmq.send/send_batch NOTIFY conveyor_queue (the server's long polls wake on it) while
    the queue is listened (conveyor.queue_listen), and not otherwise."""
    sql.execute("SELECT pgmq.create(%s)", (q,))
    with psycopg.connect(db, autocommit=True) as listener:
        listener.execute("LISTEN conveyor_queue")
        sql.execute("SELECT * FROM pgmq.send(%s, '1')", (q,))
        assert list(listener.notifies(timeout=0.3)) == []
        sql.execute("SELECT conveyor.queue_listen(%s, 60)", (q,))
        sql.execute("SELECT * FROM pgmq.send_batch(%s, ARRAY['2', '3']::jsonb[])", (q,))
        assert [n.payload for n in listener.notifies(timeout=2, stop_after=1)] == [f"2 {q}"]


def test_conditional_reads_take_only_matching_messages(sql: psycopg.Connection, q: str) -> None:
    sql.execute("SELECT pgmq.create(%s)", (q,))
    sql.execute("SELECT * FROM pgmq.send_batch(%s, ARRAY['{\"a\": 1, \"b\": 2}', '{\"a\": 2}', '{\"a\": 1}', "
                "'[1]', NULL]::jsonb[])", (q,))
    rows = sql.execute("SELECT msg_id, read_ct FROM pgmq.read(%s, 30, 5, '{\"a\": 1}')", (q,)).fetchall()
    assert rows == [(1, 1), (3, 1)]
    assert sql.execute("SELECT msg_id FROM pgmq.read(%s, 30, 5, '{\"a\": 1}')", (q,)).fetchall() == []
    polled = sql.execute("SELECT msg_id FROM pgmq.read_with_poll(%s, 30, 5, 1, 50, '{\"a\": 2}')", (q,)).fetchall()
    assert polled == [(2,)]
    # '{}' (and NULL) filter nothing; the NULL message reads back as SQL NULL
    assert sql.execute("SELECT msg_id, message IS NULL FROM pgmq.read(%s, 30, 5, '{}')", (q,)).fetchall() \
        == [(4, False), (5, True)]
    # a FIFO queue is read in group order, which a body filter would break
    sql.execute("SELECT conveyor.queue_create(%s, '{\"content_based_deduplication\": true}')", (q + ".fifo",))
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="conditional reads of FIFO queue"):
        sql.execute("SELECT * FROM pgmq.read(%s, 30, 1, '{\"a\": 1}')", (q + ".fifo",))


def test_a_conditional_read_dead_letters_past_max_receive_count(sql: psycopg.Connection, q: str) -> None:
    sql.execute("SELECT pgmq.create(%s)", (q + "_dlq",))
    sql.execute("SELECT conveyor.queue_create(%s, %s::jsonb)",
                (q, '{"max_receive_count": 1, "dead_letter_queue": "' + q + '_dlq"}'))
    sql.execute("SELECT * FROM pgmq.send_batch(%s, ARRAY['{\"k\": 1}', '{\"k\": 1}']::jsonb[])", (q,))
    sql.execute("SELECT * FROM pgmq.read(%s, 0, 1, '{\"k\": 1}')", (q,))  # message 1 has had its one receive
    assert sql.execute("SELECT msg_id FROM pgmq.read(%s, 30, 5, '{\"k\": 1}')", (q,)).fetchall() == [(2,)]
    assert scalar(sql, "SELECT count(*) FROM pgmq.q_" + q + "_dlq") == 1


def test_names(sql: psycopg.Connection) -> None:
    # pgmq addresses q_<lower(name)>: any case finds the queue, which keeps the name given
    sql.execute("SELECT pgmq.create('MixedCase')")
    sql.execute("SELECT pgmq.create('mixedcase')")  # the same queue: create is idempotent
    assert scalar(sql, "SELECT * FROM pgmq.send('MIXEDCASE', '1')") == 1
    assert scalar(sql, "SELECT count(*) FROM pgmq.q_mixedcase") == 1
    assert sql.execute("SELECT name FROM conveyor.queues").fetchall() == [("MixedCase",)]
    # names pgmq accepts but Conveyor's queues cannot carry get Conveyor's error
    with sqlstate("CVV01", "invalid queue name"):
        sql.execute("SELECT pgmq.create('has space')")
    with pytest.raises(psycopg.errors.RaiseException, match="invalid characters"):
        sql.execute("SELECT pgmq.drop_queue('x--y')")


def _read_plans(sql: psycopg.Connection) -> object:
    return scalar(sql, "SELECT c FROM pg_proc p, unnest(p.proconfig) c WHERE c LIKE 'plan_cache_mode=%%' "
                       "AND p.oid = 'pgmq._read(text, integer, integer, integer, integer, jsonb)'::regprocedure")


def test_unlogged_and_partitioned_are_real_kinds(sql: psycopg.Connection, q: str) -> None:
    # pgmq's statements plan as the engine's: generic until a queue has tables of its own
    assert _read_plans(sql) == "plan_cache_mode=force_generic_plan"
    sql.execute("SELECT pgmq.create_unlogged(%s)", (q + "_u",))
    assert _read_plans(sql) == "plan_cache_mode=force_custom_plan"
    sql.execute("SELECT pgmq.create_partitioned(%s, '1 hour', '2 days')", (q + "_t",))
    sql.execute("SELECT pgmq.create_partitioned(%s)", (q + "_n",))
    sql.execute("SELECT pgmq.create(%s)", (q,))
    kinds = {r[0]: r[1:] for r in sql.execute("SELECT name, storage, partitioning, retention_seconds "
                                               "FROM conveyor.queue_info").fetchall()}
    assert kinds[q + "_u"] == ("unlogged", None, 1209600)
    assert kinds[q + "_t"] == ("partitioned", {"by": "time", "interval": "01:00:00", "retention": "2 days",
                                               "premake": 4}, 1209600)
    # pgmq's defaults: 10000 ids a partition, those 100000 ids behind the newest dropped
    assert kinds[q + "_n"] == ("partitioned", {"by": "id", "interval": 10000, "retention": 100000,
                                               "premake": 4}, 1209600)
    assert kinds[q] == ("logged", None, 1209600)
    flags = {r[0]: r[1:3] for r in sql.execute("SELECT * FROM pgmq.list_queues()").fetchall()}
    assert (flags[q + "_u"], flags[q + "_t"], flags[q + "_n"], flags[q]) \
        == ((False, True), (True, False), (True, False), (False, False))
    # the storage itself: an unlogged table; partitions by time and by id, premade
    tables = {r[0]: r[1:] for r in sql.execute(
        "SELECT c.relname, c.relpersistence, c.relkind FROM pg_class c "
        "WHERE c.relnamespace = 'conveyor'::regnamespace AND c.relname ~ '^(messages|archive)_q[0-9]' "
        "AND c.relkind = 'r'").fetchall()}
    unlogged = [n for n, (persistence, _) in tables.items() if persistence == "u"]
    assert len(unlogged) == 1 and unlogged[0].startswith("messages_q")
    by_id = [r[0] for r in sql.execute("SELECT table_name FROM conveyor.queue_storage(%s) "
                                       "WHERE holds = 'messages'", (q + "_n",)).fetchall()]
    assert by_id[:5] == [by_id[0].rsplit("_", 1)[0] + f"_p{n}" for n in range(0, 50000, 10000)]
    assert by_id[5].endswith("_default")
    assert scalar(sql, "SELECT count(*) FROM conveyor.queue_storage(%s) WHERE holds = 'archive'", (q + "_t",)) == 6
    assert scalar(sql, "SELECT default_partition_length FROM pgmq.metrics(%s)", (q + "_t",)) == 0
    assert scalar(sql, "SELECT default_partition_length FROM pgmq.metrics(%s)", (q + "_u",)) is None
    with pytest.raises(psycopg.errors.RaiseException, match="premake must be at least 1, got 0"):
        sql.execute("SELECT pgmq.create_partitioned(%s, '10000', '100000', 0)", (q + "_z",))
    with pytest.raises(psycopg.errors.InvalidDatetimeFormat):
        sql.execute("SELECT pgmq.create_partitioned(%s, 'fortnightly')", (q + "_z",))
    # Conveyor's own limit: time partitions of at least a minute, refused as pg_partman
    # refuses what it cannot do (P0001)
    with sqlstate("P0001", "Partitioning interval must be 1 minute or greater"):
        sql.execute("SELECT pgmq.create_partitioned(%s, '10 seconds')", (q + "_z",))
    with sqlstate("P0001", "Partitioning interval must be 1 second or greater"):
        sql.execute("SELECT pgmq.create_partitioned(%s, '0.5 seconds')", (q + "_z",))
    # create* is idempotent as in pgmq, whatever kind the queue already has
    sql.execute("SELECT pgmq.create_partitioned(%s)", (q + "_u",))
    assert scalar(sql, "SELECT storage FROM conveyor.queues WHERE name = %s", (q + "_u",)) == "unlogged"


def test_kinds_work_through_pgmq(sql: psycopg.Connection, q: str) -> None:
    """Every call on every kind: the rows live in the kind's tables, retention drops
    partitions, drop_queue drops the tables (at the next maintenance)."""
    for kind, create in [("u", "SELECT pgmq.create_unlogged(%s)"),
                         ("n", "SELECT pgmq.create_partitioned(%s, '10', '20', 1)"),
                         ("t", "SELECT pgmq.create_partitioned(%s, '1 day', '30 days')")]:
        name = f"{q}_{kind}"
        sql.execute(create, (name,))
        ids = [r[0] for r in sql.execute("SELECT * FROM pgmq.send_batch(%s, ARRAY(SELECT jsonb_build_object('n', g) "
                                         "FROM generate_series(1, 45) g))", (name,)).fetchall()]
        assert ids == list(range(1, 46))
        read = sql.execute("SELECT msg_id, read_ct, message FROM pgmq.read(%s, 30, 3)", (name,)).fetchall()
        assert read == [(1, 1, {"n": 1}), (2, 1, {"n": 2}), (3, 1, {"n": 3})]
        assert scalar(sql, "SELECT count(*) FROM pgmq.read(%s, 30, 100)", (name,)) == 42
        assert sql.execute("SELECT msg_id FROM pgmq.set_vt(%s, 1, 0)", (name,)).fetchall() == [(1,)]
        assert scalar(sql, "SELECT msg_id FROM pgmq.pop(%s)", (name,)) == 1
        assert scalar(sql, "SELECT pgmq.archive(%s, 2::bigint)", (name,)) is True
        assert scalar(sql, "SELECT pgmq.delete(%s, 3::bigint)", (name,)) is True
        assert scalar(sql, "SELECT queue_length FROM pgmq.metrics(%s)", (name,)) == 42
        assert sql.execute("SELECT msg_id FROM pgmq.a_" + name).fetchall() == [(2,)]
        where = {r[0] for r in sql.execute(
            "SELECT m.tableoid::regclass::text FROM conveyor.messages m JOIN conveyor.queues q ON q.id = m.queue_id "
            "WHERE q.name = %s", (name,)).fetchall()}
        assert all(t.startswith("conveyor.messages_q") for t in where), where
    # by id, 10 a partition, keeping 20 ids behind the newest (45): 0-9 and 10-19 go
    maintained = dict(sql.execute("SELECT * FROM conveyor.maintenance()").fetchall())
    assert maintained["expired_partitions"] == 4  # messages and archive
    assert scalar(sql, "SELECT min(msg_id) FROM pgmq.q_" + q + "_n") == 20
    assert scalar(sql, "SELECT count(*) FROM pgmq.a_" + q + "_n") == 0  # the archived id 2 went with its partition
    for kind in "unt":
        assert scalar(sql, "SELECT pgmq.drop_queue(%s)", (f"{q}_{kind}",)) is True
    assert scalar(sql, "SELECT count(*) FROM pg_class WHERE relname ~ '^(messages|archive)_q[0-9]+$'") == 6
    maintained = dict(sql.execute("SELECT * FROM conveyor.maintenance()").fetchall())
    assert maintained["dropped_queue_tables"] == 6
    assert scalar(sql, "SELECT count(*) FROM pg_class WHERE relname ~ '^(messages|archive)_q[0-9]'") == 0


def test_queue_made_elsewhere_is_a_pgmq_queue(sql: psycopg.Connection, q: str) -> None:
    sql.execute("SELECT conveyor.queue_create(%s, '{\"visibility_timeout\": 60}')", (q,))
    sql.execute("SELECT conveyor.message_send(%s, 'plain text')", (q,))
    sql.execute("SELECT conveyor.message_send(%s, '{\"json\": \"text\"}')", (q,))
    assert (q, False, False) in [r[:3] for r in sql.execute("SELECT * FROM pgmq.list_queues()").fetchall()]
    rows = sql.execute("SELECT msg_id, message FROM pgmq.read(%s, 30, 5) ORDER BY msg_id", (q,)).fetchall()
    # a body that is JSON reads back parsed; any other text as a JSON string
    assert rows == [(1, "plain text"), (2, {"json": "text"})]
    sql.execute("SELECT pgmq.create(%s)", (q,))  # adds its views, changes nothing else
    assert scalar(sql, "SELECT visibility_timeout FROM conveyor.queues WHERE name = %s", (q,)) == 60
    assert scalar(sql, "SELECT count(*) FROM pgmq.q_" + q) == 2


def test_roles(sql: psycopg.Connection, q: str) -> None:
    sql.execute("SELECT pgmq.create(%s)", (q,))
    sql.execute("SET ROLE conveyor_reader")
    assert scalar(sql, "SELECT queue_length FROM pgmq.metrics(%s)", (q,)) == 0
    assert scalar(sql, "SELECT count(*) FROM pgmq.q_" + q) == 0
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        sql.execute("SELECT pgmq.send(%s, '1')", (q,))
    sql.execute("RESET ROLE")
    sql.execute("SET ROLE conveyor_writer")
    assert scalar(sql, "SELECT * FROM pgmq.send(%s, '1')", (q,)) == 1
    assert scalar(sql, "SELECT msg_id FROM pgmq.read(%s, 30, 1)", (q,)) == 1
    assert scalar(sql, "SELECT pgmq.archive(%s, 1::bigint)", (q,)) is True
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        sql.execute("SELECT pgmq.purge_queue(%s)", (q,))
    sql.execute("RESET ROLE")
    sql.execute("SET ROLE conveyor_admin")
    sql.execute("SELECT pgmq.create(%s)", (q + "_2",))
    assert scalar(sql, "SELECT pgmq.drop_queue(%s)", (q + "_2",)) is True
    sql.execute("RESET ROLE")


def test_dialect_refused_beside_the_real_pgmq(empty_dsn: str) -> None:
    from conveyor import errors

    pgmq_support.install_real_pgmq(empty_dsn)
    with pytest.raises(errors.SchemaMismatch, match="schema named pgmq"):
        pgmq_support.install_dialect(empty_dsn)


# -- the direct paths (dialect migration 0002): what the engine's own calls store ----------

STORED = ("SELECT body, content_type, headers, group_id, receive_count, vt - sent_at, sent_at = now(), "
          "message_uuid IS NOT NULL, dedup_id, sender_id, system_attributes, source_queue_id "
          "FROM conveyor.messages WHERE queue_id = (SELECT id FROM conveyor.queues WHERE name = %s) ORDER BY id")


def test_sends_store_what_the_engines_send_stores(sql: psycopg.Connection, q: str) -> None:
    """pgmq.send/send_batch insert into conveyor.messages themselves (standard queues):
    row for row what conveyor.message_send_json stores for the same messages, and a batch
    what the same messages sent one by one store."""
    sql.execute("SELECT pgmq.create(%s)", (q + "_a",))
    sql.execute("SELECT pgmq.create(%s)", (q + "_b",))
    sql.execute("SELECT pgmq.create(%s)", (q + "_c",))
    msgs = ['{"n": 1}', "null", '"text"', '{"n": [1, 2]}']
    headers = ['{"x-pgmq-group": "g1", "k": "v"}', "null", None, '{"k": 2}']
    with sql.transaction():
        for m, h in zip(msgs, headers, strict=True):
            sql.execute("SELECT * FROM pgmq.send(%s, %s::jsonb, %s::jsonb, 5)", (q + "_a", m, h))
        sql.execute("SELECT * FROM pgmq.send_batch(%s, %s::jsonb[], %s::jsonb[], 5)", (q + "_b", msgs, headers))
        sql.execute("SELECT * FROM conveyor.message_send_json(%s, (SELECT jsonb_agg(jsonb_build_object("
                    "'body', coalesce(m::jsonb, 'null')::text, 'content_type', 'application/json', "
                    "'headers', CASE WHEN jsonb_typeof(h::jsonb) <> 'null' THEN h::jsonb END, "
                    "'group_id', h::jsonb ->> 'x-pgmq-group', 'delay', 5) ORDER BY i) "
                    "FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS u(m, h, i)))",
                    (q + "_c", msgs, headers))
        rows = [sql.execute(STORED.encode(), (name,)).fetchall() for name in (q + "_a", q + "_b", q + "_c")]
    assert rows[0] == rows[1] == rows[2]
    made = [u for (u,) in sql.execute("SELECT message_uuid FROM conveyor.messages m JOIN conveyor.queues x "
                                      "ON x.id = m.queue_id WHERE x.name = ANY (%s)", ([q + "_a", q + "_b", q + "_c"],))]
    assert len(set(made)) == len(made) == 12 and {(u.version, u.variant) for u in made} == {(4, uuid.RFC_4122)}
    assert [r[:4] for r in rows[0]] == [('{"n": 1}', "application/json", {"x-pgmq-group": "g1", "k": "v"}, "g1"),
                                        ("null", "application/json", None, None),
                                        ('"text"', "application/json", None, None),
                                        ('{"n": [1, 2]}', "application/json", {"k": 2}, None)]
    assert {r[5] for r in rows[0]} == {timedelta(seconds=5)}
    with sqlstate("CVM01", "at most 1024 bytes"):
        sql.execute("SELECT conveyor.queue_alter(%s, '{\"max_message_size\": 1024}')", (q + "_a",))
        sql.execute("SELECT * FROM pgmq.send(%s, %s::jsonb)", (q + "_a", '{"x": "' + "y" * 1100 + '"}'))
    with sqlstate("CVV01", "headers and system_attributes must be JSON objects"):
        sql.execute("SELECT * FROM pgmq.send(%s, '1', '[1]'::jsonb)", (q + "_a",))


def test_a_fifo_queue_takes_the_engines_fifo_path(sql: psycopg.Connection, q: str) -> None:
    """A FIFO queue (made through SQS or REST) deduplicates and orders groups through
    conveyor._send and its FIFO claim, also when written and read through pgmq."""
    name = q + ".fifo"
    sql.execute("SELECT conveyor.queue_create(%s, '{\"content_based_deduplication\": true}')", (name,))
    first = scalar(sql, "SELECT * FROM pgmq.send(%s, '{\"a\": 1}', '{\"x-pgmq-group\": \"g\"}'::jsonb)", (name,))
    again = scalar(sql, "SELECT * FROM pgmq.send(%s, '{\"a\": 1}', '{\"x-pgmq-group\": \"g\"}'::jsonb)", (name,))
    ids = [i for (i,) in sql.execute("SELECT * FROM pgmq.send_batch(%s, ARRAY['{\"a\": 2}', '{\"a\": 3}']::jsonb[], "
                                     "array_fill('{\"x-pgmq-group\": \"g\"}'::jsonb, ARRAY[2]))", (name,))]
    assert again == first and first < ids[0] < ids[1]  # a duplicate is answered with the first's id
    assert sql.execute("SELECT group_id, dedup_id IS NOT NULL FROM conveyor.messages").fetchall() == [("g", True)] * 3
    # one group, one consumer at a time: the first read takes the group, the second nothing
    assert [r[0] for r in sql.execute("SELECT msg_id FROM pgmq.read(%s, 30, 2)", (name,))] == [first, ids[0]]
    assert sql.execute("SELECT msg_id FROM pgmq.read(%s, 30, 2)", (name,)).fetchall() == []
    with sqlstate("CVV01", "FIFO queues take no per-message delay"):
        sql.execute("SELECT * FROM pgmq.send(%s, '1', '{\"x-pgmq-group\": \"g\"}'::jsonb, 5)", (name,))


def test_pop_reports_the_message_before_the_pop(sql: psycopg.Connection, q: str) -> None:
    sql.execute("SELECT pgmq.create(%s)", (q,))
    sql.execute("SELECT * FROM pgmq.send_batch(%s, ARRAY['1', '2']::jsonb[])", (q,))
    sql.execute("SELECT * FROM pgmq.read(%s, 0, 1)", (q,))  # message 1 read once, visible again
    read_at = scalar(sql, "SELECT first_received_at FROM conveyor.messages WHERE id = 1")
    popped = sql.execute("SELECT msg_id, read_ct, last_read_at, vt BETWEEN now() AND clock_timestamp(), message "
                         "FROM pgmq.pop(%s, 5)", (q,)).fetchall()
    # oldest visible first: message 1 became visible again when it was read
    assert popped == [(2, 0, None, True, 2), (1, 1, read_at, True, 1)]
    assert scalar(sql, "SELECT count(*) FROM pgmq.q_" + q) == 0


def test_pop_with_a_redrive_policy_dead_letters_as_a_receive_does(sql: psycopg.Connection, q: str) -> None:
    sql.execute("SELECT pgmq.create(%s)", (q + "_dlq",))
    sql.execute("SELECT conveyor.queue_create(%s, %s::jsonb)",
                (q, '{"max_receive_count": 1, "dead_letter_queue": "' + q + '_dlq"}'))
    sql.execute("SELECT * FROM pgmq.send_batch(%s, ARRAY['1', '2']::jsonb[])", (q,))
    sql.execute("SELECT * FROM pgmq.read(%s, 0, 1)", (q,))  # message 1 has had its one receive
    assert sql.execute("SELECT msg_id, read_ct, message FROM pgmq.pop(%s, 5)", (q,)).fetchall() == [(2, 0, 2)]
    # its receive count moves with it (as SQS keeps ApproximateReceiveCount): this read is its second
    assert sql.execute("SELECT message, read_ct FROM pgmq.read(%s, 30, 5)", (q + "_dlq",)).fetchall() == [(1, 2)]


def test_archive_and_delete_of_one_id_equal_those_of_an_array(sql: psycopg.Connection, q: str) -> None:
    sql.execute("SELECT pgmq.create(%s)", (q,))
    sql.execute("SELECT * FROM pgmq.send_batch(%s, ARRAY['1', '2', '3', '4']::jsonb[], "
                "array_fill('{\"h\": 1}'::jsonb, ARRAY[4]))", (q,))
    sql.execute("SELECT * FROM pgmq.read(%s, 0, 4)", (q,))
    assert scalar(sql, "SELECT pgmq.archive(%s, 1::bigint)", (q,)) is True
    assert sql.execute("SELECT * FROM pgmq.archive(%s, ARRAY[2, 99]::bigint[])", (q,)).fetchall() == [(2,)]
    assert scalar(sql, "SELECT pgmq.archive(%s, 1::bigint)", (q,)) is False
    archived = sql.execute("SELECT id, receive_count, first_received_at IS NOT NULL, body, content_type, headers, "
                           "outcome, archived_at IS NOT NULL FROM conveyor.archive ORDER BY id").fetchall()
    assert [a[1:] for a in archived] == [(1, True, str(n), "application/json", {"h": 1}, "completed", True)
                                         for n in (1, 2)]
    assert scalar(sql, "SELECT pgmq.delete(%s, 3::bigint)", (q,)) is True
    assert sql.execute("SELECT * FROM pgmq.delete(%s, ARRAY[4, 3]::bigint[])", (q,)).fetchall() == [(4,)]
    assert scalar(sql, "SELECT count(*) FROM conveyor.messages") == 0


def test_hot_calls_read_their_rows_only_on_a_queue_the_statistics_have_not_seen(sql: psycopg.Connection,
                                                                                 q: str) -> None:
    """As Conveyor's own message functions (tests/sql/test_plans.py): the dialect's calls
    keep generic plans, so a queue filled after the last ANALYZE is not read whole."""
    sql.execute("SELECT pgmq.create(%s)", (q + "_known",))
    sql.execute("SELECT * FROM pgmq.send_batch(%s, array_fill('1'::jsonb, ARRAY[50]))", (q + "_known",))
    sql.execute("ANALYZE conveyor.messages")
    sql.execute("SELECT pgmq.create(%s)", (q,))
    sql.execute("SELECT * FROM pgmq.send_batch(%s, array_fill('1'::jsonb, ARRAY[3000]))", (q,))
    read = ("SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid))::bigint FROM pg_index "
            "WHERE indrelid = 'conveyor.messages'::regclass")
    with sql.transaction():
        before = scalar(sql, read)
        for _ in range(6):
            (first,), (second,) = sql.execute("SELECT msg_id FROM pgmq.read(%s, 30, 2)", (q,)).fetchall()
            sql.execute("SELECT pgmq.archive(%s, %s::bigint)", (q, first))
            sql.execute("SELECT pgmq.delete(%s, %s::bigint)", (q, second))
            sql.execute("SELECT * FROM pgmq.pop(%s)", (q,))
            sql.execute("SELECT * FROM pgmq.send(%s, '1')", (q,))
        done = scalar(sql, read)
    assert done - before < 600, f"{done - before} index entries read for 30 calls on a queue of 3000 messages"


# -- a pgmq queue is a Conveyor queue: SQS through a real server ---------------------------

@pytest.fixture(scope="module")
def pgmq_server(pgmq_template: str) -> Iterator[ServerProcess]:
    name = unique_name("conveyor_pgmq_srv")
    dsn = create_database(name, template=pgmq_template)
    proc = ServerProcess(dsn, env={"CONVEYOR_DIALECTS": "pgmq"}).start()
    yield proc
    proc.kill()
    drop_database(name)


@pytest.mark.parametrize("protocol", ["json", "query"])
def test_sqs_and_pgmq_share_queues(pgmq_server: ServerProcess, protocol: str) -> None:
    dsn = pgmq_server.env["DATABASE_URL"]
    q = f"shared_{uuid.uuid4().hex[:8]}"
    sqs = sqs_clients.client(pgmq_server.url, protocol)
    with psycopg.connect(dsn, autocommit=True) as sql:
        sql.execute("SELECT pgmq.create(%s)", (q,))
        sql.execute("SELECT pgmq.send(%s, '{\"from\": \"pgmq\"}', '{\"trace\": \"abc\"}'::jsonb)", (q,))
        url = sqs.get_queue_url(QueueName=q)["QueueUrl"]
        got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"], VisibilityTimeout=30)["Messages"]
        assert got[0]["Body"] == '{"from": "pgmq"}'
        assert got[0]["MessageAttributes"]["trace"] == {"StringValue": "abc", "DataType": "String"}
        # the SQS receive counts as a read
        assert scalar(sql, "SELECT read_ct FROM pgmq.q_" + q) == 1
        sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
        assert scalar(sql, "SELECT queue_length FROM pgmq.metrics(%s)", (q,)) == 0

        sqs.send_message(QueueUrl=url, MessageBody="not json",
                         MessageAttributes={"kind": {"DataType": "String", "StringValue": "sqs"}})
        sqs.send_message(QueueUrl=url, MessageBody='{"from": "sqs"}')
        rows = sql.execute("SELECT msg_id, read_ct, message, headers FROM pgmq.read(%s, 30, 10) ORDER BY msg_id",
                           (q,)).fetchall()
        assert rows == [(2, 1, "not json", {"kind": {"DataType": "String", "StringValue": "sqs"}}),
                        (3, 1, {"from": "sqs"}, None)]
        assert sql.execute("SELECT * FROM pgmq.archive(%s, ARRAY[2, 3]::bigint[])", (q,)).fetchall() == [(2,), (3,)]
        assert scalar(sql, "SELECT count(*) FROM pgmq.a_" + q) == 2
        assert scalar(sql, "SELECT pgmq.drop_queue(%s)", (q,)) is True
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName=q)


def test_pgmq_client_kinds_read_through_sqs(pgmq_server: ServerProcess) -> None:
    """Queues the pgmq client makes unlogged and partitioned are Conveyor queues of those
    kinds: boto3 reads, deletes and sends on them; pgmq sees what SQS did."""
    dsn = pgmq_server.env["DATABASE_URL"]
    base = f"kind_{uuid.uuid4().hex[:8]}"
    client = SyncPGMQueue(conn_string=dsn, init_extension=False, pool_size=2)
    sqs = sqs_clients.client(pgmq_server.url, "json")
    try:
        client.create_queue(base + "_u", unlogged=True)
        client.create_partitioned_queue(base + "_p", partition_interval=100, retention_interval=1000)
        client.create_partitioned_queue(base + "_t", partition_interval="1 day", retention_interval="7 days")
        for q in (base + "_u", base + "_p", base + "_t"):
            assert client.send_batch(q, [{"n": i} for i in range(5)]) == [1, 2, 3, 4, 5]
            url = sqs.get_queue_url(QueueName=q)["QueueUrl"]
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30)["Messages"]
            got.sort(key=lambda m: json.loads(m["Body"])["n"])
            assert [json.loads(m["Body"])["n"] for m in got] == [0, 1, 2, 3, 4]
            for m in got[:2]:
                sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=got[2]["ReceiptHandle"], VisibilityTimeout=0)
            sqs.send_message(QueueUrl=url, MessageBody='{"from": "sqs"}')
            assert client.metrics(q).queue_length == 4
            assert [(m.msg_id, m.read_ct) for m in client.read(q, vt=30, qty=10)] == [(3, 2), (6, 1)]
            assert client.archive(q, 6) is True
        with psycopg.connect(dsn, autocommit=True) as sql:
            stored = dict(sql.execute(
                "SELECT q.name, array_agg(DISTINCT m.tableoid::regclass::text) FROM conveyor.messages m "
                "JOIN conveyor.queues q ON q.id = m.queue_id WHERE q.name LIKE %s GROUP BY q.name",
                (base + "%",)).fetchall())
            assert all(t.startswith("conveyor.messages_q") for tables in stored.values() for t in tables), stored
            assert scalar(sql, "SELECT relpersistence FROM pg_class WHERE oid = %s::regclass",
                          (stored[base + "_u"][0],)) == "u"
        with pytest.warns(UserWarning):
            flags = {r.queue_name: (r.is_unlogged, r.is_partitioned) for r in client.list_queues()}
        assert (flags[base + "_u"], flags[base + "_p"], flags[base + "_t"]) == ((True, False), (False, True),
                                                                                (False, True))
    finally:
        client.close()


def test_rest_lists_pgmq_queues(pgmq_server: ServerProcess) -> None:
    q = f"rest_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pgmq_server.env["DATABASE_URL"], autocommit=True) as sql:
        sql.execute("SELECT pgmq.create_unlogged(%s)", (q,))
        sql.execute("SELECT pgmq.send(%s, '{\"n\": 1}')", (q,))
    with pgmq_server.client() as http:
        listed = http.get("/v1/queues", params={"prefix": q}).json()
        # Conveyor's own listing says how the queue is stored, as pgmq.list_queues does
        assert [(x["name"], x["is_unlogged"], x["storage"], x["retention_seconds"]) for x in listed] \
            == [(q, True, "unlogged", 1209600)]
        received = http.get(f"/v1/queues/{q}/messages", params={"max": 1}).json()
    assert [(m["id"], m["message"]) for m in received] == [(1, {"n": 1})]


# -- the migration guide's SQL, as the docs give it ----------------------------------------

def _doc_block(marker: str) -> str:
    text = DOC.read_text("utf-8")
    found = re.search(rf"<!-- {marker} -->\s*```sql\n(.*?)```", text, re.S)
    assert found, marker
    return found.group(1)


def test_migration_guide(empty_dsn: str) -> None:
    pgmq_support.install_real_pgmq(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as real:
        real.execute("SELECT pgmq.create('orders')")
        real.execute("SELECT pgmq.create_unlogged('Fast')")
        real.execute("SELECT pgmq.send_batch('orders', ARRAY['{\"n\": 1}', '{\"n\": 2}', '{\"n\": 3}']::jsonb[])")
        real.execute("SELECT pgmq.send('orders', '{\"n\": 4}', '{\"x-pgmq-group\": \"g\"}', 600)")
        real.execute("SELECT * FROM pgmq.read('orders', 120, 1)")
        real.execute("SELECT pgmq.archive('orders', 2::bigint)")
        real.execute("SELECT pgmq.delete('orders', 3::bigint)")
        real.execute("SELECT pgmq.send('Fast', '\"x\"')")
        real.execute("SELECT pgmq.send('Fast', NULL::jsonb)")
        before = real.execute("SELECT msg_id, read_ct, vt, message, headers FROM pgmq.q_orders ORDER BY msg_id"
                              ).fetchall()
    pgmq_support.install_core(empty_dsn)
    with psycopg.connect(empty_dsn) as conn:
        conn.execute(_doc_block("migrate-copy").encode())
        conn.commit()
    pgmq_support.install_dialect(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as sql:
        sql.execute(_doc_block("migrate-views").encode())
        after = sql.execute("SELECT msg_id, read_ct, vt, message, headers FROM pgmq.q_orders ORDER BY msg_id"
                            ).fetchall()
        assert after == before
        assert sql.execute("SELECT msg_id, message FROM pgmq.a_orders").fetchall() == [(2, {"n": 2})]
        assert scalar(sql, "SELECT group_id FROM conveyor.messages WHERE id = 4") == "g"
        assert scalar(sql, "SELECT * FROM pgmq.send('orders', '{\"n\": 5}')") == 5  # ids continue
        assert sql.execute("SELECT message IS NULL FROM pgmq.read('fast', 30, 5)").fetchall() == [(False,), (True,)]
        assert sql.execute("SELECT queue_name, is_unlogged FROM pgmq.list_queues()").fetchall() \
            == [("orders", False), ("Fast", True)]
