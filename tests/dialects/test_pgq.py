"""The pgq dialect (src/conveyor/sql/dialects/pgq, docs/dialects/pgq.md): PgQ 3's SQL
consumer API and CDC triggers over Conveyor's streams.

Proof by PgQ's own parts: skytools' ``pgq`` package drives a consumer unmodified, and the
CDC triggers are compared event by event with the real PgQ extension's C triggers
(Debian's postgresql-15-pgq3, installed by .ci/run) in a scratch database of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pgq
import psycopg
import psycopg2
import pytest
from psycopg import conninfo

from conftest import Databases, create_database, drop_database, unique_name
from conveyor import errors
from conveyor.db import migrate, pool

# -- fixtures (kept here: tests/dialects is shared with other dialects' modules) ---------


@pytest.fixture(scope="module")
def pgq_template(template_db: str) -> Iterator[str]:
    """Conveyor's template with the pgq dialect installed, cloned by ``db``."""
    name = unique_name("conveyor_pgq_tpl")
    dsn = create_database(name, template=template_db)

    async def install() -> None:
        async with pool.connect(dsn) as conn:
            await migrate.migrate(conn, dialects=("pgq",))

    asyncio.run(install())
    yield name
    drop_database(name)


@pytest.fixture
def db(request: pytest.FixtureRequest, pgq_template: str, databases: Databases) -> Iterator[str]:
    if request.node.get_closest_marker("own_cluster") is not None:
        own = request.getfixturevalue("own_cluster")
        name = own.clone(dialects=("pgq",))
        yield own.dsn_for(name)
        own.drop(name)
        return
    name = unique_name("conveyor_pgq")
    yield create_database(name, template=pgq_template)
    databases.drop_later(name)  # off the test's path


@pytest.fixture
def sql(db: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(db, autocommit=True) as conn:
        yield conn


def _real_pgq_database() -> Iterator[str]:
    """A scratch database with the real PgQ extension (C triggers), for comparison."""
    name = unique_name("conveyor_realpgq")
    dsn = create_database(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pgq")
    yield dsn
    drop_database(name)


real_pgq = pytest.fixture(scope="module", name="real_pgq")(_real_pgq_database)
# for a test that sees every queue of the database (PGQStatus): none left by other tests
fresh_real_pgq = pytest.fixture(name="fresh_real_pgq")(_real_pgq_database)


def one(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def error_of(conn: psycopg.Connection[Any], query: str, *params: Any) -> str:
    with pytest.raises(psycopg.errors.RaiseException) as info:
        conn.execute(query, params)
    assert info.value.sqlstate == "P0001"
    return info.value.diag.message_primary or ""


def tick(conn: psycopg.Connection[Any], queue: str) -> None:
    one(conn, "SELECT pgq.force_tick(%s)", queue)


# -- queues and consumers -----------------------------------------------------------------


def test_queues_and_consumers_answer_as_pgq(sql):
    assert one(sql, "SELECT pgq.create_queue('orders')") == 1
    assert one(sql, "SELECT pgq.create_queue('orders')") == 0
    assert error_of(sql, "SELECT pgq.create_queue(NULL)") == "Invalid NULL value"
    # a PgQ queue is a Conveyor stream
    assert one(sql, "SELECT count(*) FROM conveyor.stream_list() WHERE name = 'orders'") == 1
    assert one(sql, "SELECT pgq.register_consumer('orders', 'billing')") == 1
    assert one(sql, "SELECT pgq.register_consumer('orders', 'billing')") == 0
    assert error_of(sql, "SELECT pgq.register_consumer('nope', 'billing')") == "Event queue not created yet"
    assert error_of(sql, "SELECT pgq.register_consumer_at('orders', 'x', 999999)") == (
        "cannot reposition, tick not found: 999999")
    assert error_of(sql, "SELECT pgq.drop_queue('orders')") == "cannot drop queue, consumers still attached"
    assert error_of(sql, "SELECT pgq.drop_queue('nope')") == "No such event queue"
    assert one(sql, "SELECT pgq.unregister_consumer('orders', 'billing')") == 1
    assert one(sql, "SELECT pgq.unregister_consumer('orders', 'billing')") == 0
    assert one(sql, "SELECT pgq.unregister_consumer('nope', 'billing')") == 0
    assert one(sql, "SELECT pgq.drop_queue('orders')") == 1
    one(sql, "SELECT pgq.create_queue('orders')")
    one(sql, "SELECT pgq.register_consumer('orders', 'a')")
    assert one(sql, "SELECT pgq.drop_queue('orders', true)") == 1
    assert one(sql, "SELECT count(*) FROM conveyor.stream_list()") == 0


def test_insert_event_forms_and_errors(sql):
    one(sql, "SELECT pgq.create_queue('q')")
    assert error_of(sql, "SELECT pgq.insert_event('nope', 't', 'd')") == "No such queue"
    assert error_of(sql, "SELECT pgq.insert_event(NULL, 't', 'd')") == "Queue name must not be NULL"
    first = one(sql, "SELECT pgq.insert_event('q', 't', 'd')")
    second = one(sql, "SELECT pgq.insert_event('q', NULL, 'd2', 'e1', 'e2', 'e3', 'e4')")
    assert second == first + 1
    # the same events through the engine's own reader
    one(sql, "SELECT conveyor.stream_subscribe('q', 'native')")
    sql.execute("UPDATE conveyor.stream_consumers SET last_tick = (SELECT min(tick_id) FROM conveyor.stream_ticks)")
    tick(sql, "q")
    rows = sql.execute("SELECT id, type, payload, extra1, extra4 FROM conveyor.stream_receive('q', 'native')").fetchall()
    assert rows == [(first, "t", "d", None, None), (second, None, "d2", "e1", "e4")]


def _insert_event_knows(conn: psycopg.Connection[Any], stream: str) -> bool:
    """Whether pgq.insert_event (dialect migration 0002) has static inserts for the stream."""
    sid = one(conn, "SELECT id FROM conveyor.streams WHERE name = %s", stream)
    return f"IF stream_id = {sid} THEN" in one(conn, "SELECT prosrc FROM pg_proc WHERE oid = 'pgq.insert_event(text, text, text, text, text, text, text)'::regprocedure")


def test_insert_event_keeps_a_plan_per_stream_table(sql):
    """insert_event appends through statements written for each stream's tables; a stream
    made since (by any interface) gets them at its first event, which goes the dynamic way."""
    one(sql, "SELECT pgq.create_queue('a')")
    one(sql, "SELECT conveyor.stream_create('b')")
    assert not _insert_event_knows(sql, "a") and not _insert_event_knows(sql, "b")
    ids = [one(sql, "SELECT pgq.insert_event(%s, 't', %s)", q, f"{q}{n}") for n in range(3) for q in ("a", "b")]
    assert _insert_event_knows(sql, "a") and _insert_event_knows(sql, "b")
    dropped = one(sql, "SELECT id FROM conveyor.streams WHERE name = 'a'")
    one(sql, "SELECT pgq.drop_queue('a')")
    one(sql, "SELECT pgq.create_queue('c')")
    one(sql, "SELECT pgq.insert_event('c', 't', 'c0')")
    assert _insert_event_knows(sql, "c") and _insert_event_knows(sql, "b")
    assert f"IF stream_id = {dropped} THEN" not in one(sql, "SELECT prosrc FROM pg_proc WHERE oid = 'pgq.insert_event(text, text, text, text, text, text, text)'::regprocedure")
    assert ids[1::2] == [ids[1], ids[1] + 1, ids[1] + 2]  # each stream's own sequence, static or not
    # the rows are the dynamic path's: in the stream's current table, with the event columns given
    table = one(sql, "SELECT queue_data_pfx || '_' || queue_cur_table FROM pgq.queue WHERE queue_name = 'b'")
    assert sql.execute(f"SELECT ev_id, ev_type, ev_data, ev_extra1, ev_owner, ev_retry, ev_txid IS NOT NULL FROM {table} "
                       "ORDER BY ev_id").fetchall() == [(i, "t", f"b{n}", None, None, None, True)
                                                      for n, i in enumerate(ids[1::2])]
    # a rotated stream appends to its new current table through the same function
    sql.execute("UPDATE conveyor.streams SET switch_time = now() - interval '3 hours' WHERE name = 'b'")
    sql.execute("SELECT pgq.maint_rotate_tables_step1('b')")
    assert one(sql, "SELECT queue_cur_table FROM pgq.get_queue_info('b')") == 1
    after = one(sql, "SELECT pgq.insert_event('b', 't', 'rotated')")
    assert one(sql, "SELECT ev_data FROM conveyor.stream_" + str(one(sql, "SELECT id FROM conveyor.streams WHERE name = 'b'"))
               + "_1 WHERE ev_id = %s", after) == "rotated"


def test_insert_event_does_not_wait_for_another_rewrite(db, sql):
    """While one transaction rewrites pgq.insert_event (holding its lock to commit), others append
    the dynamic way instead of waiting; the next event after it rewrites again."""
    with psycopg.connect(db) as other:
        other.execute("SELECT pg_advisory_xact_lock(hashtext('pgq._insert_event_rewrite'))")
        one(sql, "SELECT pgq.create_queue('late')")
        first = one(sql, "SELECT pgq.insert_event('late', 't', 'one')")
        assert not _insert_event_knows(sql, "late")
        other.rollback()
    assert one(sql, "SELECT pgq.insert_event('late', 't', 'two')") == first + 1
    assert _insert_event_knows(sql, "late")


def test_set_queue_config_maps_onto_stream_options(sql):
    one(sql, "SELECT pgq.create_queue('q')")
    assert one(sql, "SELECT pgq.set_queue_config('q', 'ticker_max_count', '7')") == 1
    assert one(sql, "SELECT pgq.set_queue_config('q', 'ticker_max_lag', '5')") == 1
    assert one(sql, "SELECT pgq.set_queue_config('q', 'rotation_period', '1 hour')") == 1
    assert one(sql, "SELECT pgq.set_queue_config('q', 'ticker_paused', 'true')") == 1
    assert one(sql, "SELECT pgq.set_queue_config('q', 'external_ticker', 'false')") == 1
    row = sql.execute("SELECT ticker_max_count, ticker_max_lag, rotation_period, ticker_paused"
                      " FROM conveyor.stream_get('q')").fetchone()
    assert row == (7, datetime.timedelta(seconds=5), datetime.timedelta(hours=1), True)
    assert error_of(sql, "SELECT pgq.ticker('q')") == "Ticker has been paused for this queue"
    # PgQ's message, its stray "s" included
    assert error_of(sql, "SELECT pgq.set_queue_config('q', 'queue_name', 'x')") == (
        'cannot change parameter "queue_names"')
    assert error_of(sql, "SELECT pgq.set_queue_config('nope', 'ticker_max_lag', '1')") == "No such event queue"
    assert error_of(sql, "SELECT pgq.set_queue_config('q', NULL, '1')") == "Invalid NULL value"
    assert "external_ticker" in error_of(sql, "SELECT pgq.set_queue_config('q', 'external_ticker', 'true')")
    assert error_of(sql, "SELECT pgq.ticker('q', 5, now(), 10)") == "queue not found or ticker disabled: q"


# -- batches ------------------------------------------------------------------------------


def test_batch_cycle(sql):
    one(sql, "SELECT pgq.create_queue('q')")
    one(sql, "SELECT pgq.register_consumer('q', 'c')")
    assert sql.execute("SELECT * FROM pgq.next_batch_info('q', 'c')").fetchone() == (None,) * 7
    assert one(sql, "SELECT pgq.next_batch('q', 'c')") is None
    assert error_of(sql, "SELECT pgq.next_batch('q', 'other')") == "Not subscriber to queue: q/other"
    with sql.transaction():
        ids = [one(sql, "SELECT pgq.insert_event('q', 'type', %s)", f"data{i}") for i in range(3)]
        txid = one(sql, "SELECT txid_current()")
    assert one(sql, "SELECT pgq.ticker('q')") is None  # not needed yet: 3 events, no lag
    tick(sql, "q")
    info = sql.execute("SELECT * FROM pgq.next_batch_info('q', 'c')").fetchone()
    batch, cur_tick, prev_tick, cur_time, prev_time, cur_seq, prev_seq = info
    assert cur_tick > prev_tick and cur_time >= prev_time and cur_seq - prev_seq == 3
    assert one(sql, "SELECT pgq.next_batch('q', 'c')") == batch  # the open batch again
    cur = sql.execute("SELECT * FROM pgq.get_batch_events(%s)", (batch,))
    assert [d.name for d in cur.description or []] == [
        "ev_id", "ev_time", "ev_txid", "ev_retry", "ev_type", "ev_data", "ev_extra1", "ev_extra2", "ev_extra3",
        "ev_extra4"]
    rows = cur.fetchall()
    assert [(r[0], r[2], r[3], r[4], r[5]) for r in rows] == [
        (ids[i], txid, None, "type", f"data{i}") for i in range(3)]
    info = sql.execute("SELECT * FROM pgq.get_batch_info(%s)", (batch,)).fetchone()
    assert info[:2] == ("q", "c") and info[4:6] == (prev_tick, cur_tick) and info[7:] == (prev_seq, cur_seq)
    assert one(sql, "SELECT pgq.finish_batch(%s)", batch) == 1
    assert one(sql, "SELECT pgq.finish_batch(%s)", batch) == 0  # with a warning, as PgQ
    assert error_of(sql, "SELECT * FROM pgq.get_batch_events(%s)", batch) == "batch not found"
    assert one(sql, "SELECT pgq.next_batch('q', 'c')") is None
    consumer = sql.execute("SELECT queue_name, consumer_name, last_tick, current_batch, next_tick, pending_events"
                           " FROM pgq.get_consumer_info('q', 'c')").fetchone()
    assert consumer == ("q", "c", cur_tick, None, None, 0)


def test_next_batch_with_nothing_new_is_a_read_as_in_pgq(sql, fresh_real_pgq):
    """An idle consumer's next_batch writes nothing in PgQ (no transaction id): the same
    here (the stream's consumer recorded its activity at every call before). (A database
    of its own: the module's real PgQ is compared queue for queue by other tests.)"""
    with psycopg.connect(fresh_real_pgq, autocommit=True) as real:
        for conn in (sql, real):
            queue = unique_name("idle")
            one(conn, "SELECT pgq.create_queue(%s)", queue)
            one(conn, "SELECT pgq.register_consumer(%s, 'c')", queue)
            for _ in range(2):
                with conn.transaction(force_rollback=True):
                    assert one(conn, "SELECT pgq.next_batch(%s, 'c')", queue) is None
                    assert one(conn, "SELECT pg_current_xact_id_if_assigned()") is None, conn.info.dbname


def test_a_rolled_back_insert_is_in_no_batch_and_late_commits_are_not_lost(db, sql):
    one(sql, "SELECT pgq.create_queue('q')")
    one(sql, "SELECT pgq.register_consumer('q', 'c')")
    with psycopg.connect(db) as slow:
        one(slow, "SELECT pgq.insert_event('q', 't', 'slow')")  # open across the next tick
        with pytest.raises(psycopg.errors.DivisionByZero), sql.transaction():
            one(sql, "SELECT pgq.insert_event('q', 't', 'rolled back')")
            sql.execute("SELECT 1/0")
        one(sql, "SELECT pgq.insert_event('q', 't', 'fast')")
        tick(sql, "q")
        slow.commit()
    tick(sql, "q")
    seen = []
    while (batch := one(sql, "SELECT pgq.next_batch('q', 'c')")) is not None:
        seen += [r[0] for r in sql.execute("SELECT ev_data FROM pgq.get_batch_events(%s)", (batch,))]
        one(sql, "SELECT pgq.finish_batch(%s)", batch)
    assert seen == ["fast", "slow"]


def test_get_batch_cursor_with_extra_where(sql):
    one(sql, "SELECT pgq.create_queue('q')")
    one(sql, "SELECT pgq.register_consumer('q', 'c')")
    for i in range(10):
        one(sql, "SELECT pgq.insert_event('q', %s, %s, %s, NULL, NULL, NULL)", "even" if i % 2 == 0 else "odd",
            str(i), f"public.t{i % 3}")
    tick(sql, "q")
    batch = one(sql, "SELECT pgq.next_batch('q', 'c')")
    with sql.transaction():
        first = sql.execute("SELECT ev_data FROM pgq.get_batch_cursor(%s, 'walker', 2, %s)",
                            (batch, "ev_type = 'even'")).fetchall()
        rest = sql.execute("FETCH 10 FROM walker").fetchall()  # whole rows: ev_data is the 6th
        sql.execute("CLOSE walker")
    assert [r[0] for r in first] + [r[5] for r in rest] == ["0", "2", "4", "6", "8"]
    with sql.transaction():
        rows = sql.execute("SELECT ev_data FROM pgq.get_batch_cursor(%s, 'w2', 100)", (batch,)).fetchall()
    assert len(rows) == 10
    assert sql.execute("SELECT * FROM pgq.get_batch_cursor(NULL, 'w3', 1, NULL)").fetchall() == []
    assert one(sql, "SELECT count(*) FROM pgq.batch_event_tables(%s)", batch) >= 1


def test_event_retry_batch_retry_and_maintenance(sql):
    one(sql, "SELECT pgq.create_queue('q')")
    one(sql, "SELECT pgq.register_consumer('q', 'c')")
    one(sql, "SELECT pgq.register_consumer('q', 'other')")
    ids = [one(sql, "SELECT pgq.insert_event('q', 't', %s)", str(i)) for i in range(4)]
    tick(sql, "q")
    batch = one(sql, "SELECT pgq.next_batch('q', 'c')")
    assert one(sql, "SELECT pgq.event_retry(%s, %s, 0)", batch, ids[0]) == 1
    assert one(sql, "SELECT pgq.event_retry(%s, %s, 0)", batch, ids[0]) == 0  # already waiting
    assert one(sql, "SELECT pgq.event_retry(%s, %s, now() + interval '1 hour')", batch, ids[1]) == 1
    assert error_of(sql, "SELECT pgq.event_retry(%s, 123456, 0)", batch) == "event not found"
    assert error_of(sql, "SELECT pgq.event_retry(999999, 1, 0)") == "batch not found"
    assert one(sql, "SELECT pgq.batch_retry(%s, 0)", batch) == 2  # the two not waiting yet
    assert error_of(sql, "SELECT pgq.batch_retry(999999, 0)") == "batch_retry: batch 999999 not found"
    waiting = sql.execute("SELECT ev_id, ev_retry, ev_retry_after > now() + interval '50 minutes'"
                          " FROM pgq.retry_queue ORDER BY ev_id").fetchall()
    assert waiting == [(ids[0], 1, False), (ids[1], 1, True), (ids[2], 1, False), (ids[3], 1, False)]
    one(sql, "SELECT pgq.finish_batch(%s)", batch)
    assert one(sql, "SELECT pgq.maint_retry_events()") == 3  # the hour-later one waits
    assert one(sql, "SELECT pgq.maint_retry_events()") == 0
    tick(sql, "q")
    batch = one(sql, "SELECT pgq.next_batch('q', 'c')")
    again = sql.execute("SELECT ev_id, ev_retry, ev_data FROM pgq.get_batch_events(%s)", (batch,)).fetchall()
    assert again == [(ids[0], 1, "0"), (ids[2], 1, "2"), (ids[3], 1, "3")]
    # retries are for the consumer that asked: the other one sees each event once
    seen = []
    while (b := one(sql, "SELECT pgq.next_batch('q', 'other')")) is not None:
        seen += [r[0] for r in sql.execute("SELECT ev_id FROM pgq.get_batch_events(%s)", (b,))]
        one(sql, "SELECT pgq.finish_batch(%s)", b)
    assert seen == ids


def test_info_has_pgq_columns(sql, real_pgq):
    """Same result columns, names and types, as the real extension's."""
    one(sql, "SELECT pgq.create_queue('q')")
    one(sql, "SELECT pgq.register_consumer('q', 'c')")
    one(sql, "SELECT pgq.insert_event('q', 't', 'd')")
    tick(sql, "q")
    batch = one(sql, "SELECT pgq.next_batch('q', 'c')")
    queries = ["SELECT * FROM pgq.get_queue_info()", "SELECT * FROM pgq.get_queue_info('q')",
               "SELECT * FROM pgq.get_consumer_info()", "SELECT * FROM pgq.get_consumer_info('q')",
               "SELECT * FROM pgq.get_consumer_info('q', 'c')", "SELECT * FROM pgq.get_batch_info(%(b)s)",
               "SELECT * FROM pgq.next_batch_info('q', 'c')", "SELECT * FROM pgq.get_batch_events(%(b)s)",
               "SELECT * FROM pgq.maint_operations()", "SELECT * FROM pgq.queue", "SELECT * FROM pgq.subscription",
               "SELECT * FROM pgq.consumer", "SELECT * FROM pgq.retry_queue"]
    with psycopg.connect(real_pgq, autocommit=True) as real:
        one(real, "SELECT pgq.create_queue('q')")
        one(real, "SELECT pgq.register_consumer('q', 'c')")
        one(real, "SELECT pgq.insert_event('q', 't', 'd')")
        one(real, "SELECT pgq.ticker('q')")
        real_batch = one(real, "SELECT pgq.next_batch('q', 'c')")
        for query in queries:
            ours = sql.execute(query, {"b": batch})
            theirs = real.execute(query, {"b": real_batch})
            assert [(d.name, d.type_code) for d in ours.description or []] == [
                (d.name, d.type_code) for d in theirs.description or []], query
            assert len(ours.fetchall()) == len(theirs.fetchall()), query
    queue = sql.execute("SELECT queue_name, queue_ntables, queue_external_ticker, ev_new, last_tick_id"
                        " FROM pgq.get_queue_info('q')").fetchone()
    assert queue == ("q", 3, False, 0, one(sql, "SELECT cur_tick_id FROM pgq.next_batch_info('q', 'c')"))
    assert one(sql, "SELECT pgq.version()") == "3.5"


@pytest.mark.own_cluster  # rotation waits for transactions older than the switch, anywhere on the server
def test_rotation_through_pgq_maintenance_keeps_events(sql):
    one(sql, "SELECT pgq.create_queue('q')")
    one(sql, "SELECT pgq.set_queue_config('q', 'rotation_period', '1 second')")
    one(sql, "SELECT pgq.register_consumer('q', 'c')")
    sql.execute("UPDATE conveyor.streams SET switch_time = now() - interval '1 minute'")
    one(sql, "SELECT pgq.insert_event('q', 't', 'before')")
    tick(sql, "q")
    batch = one(sql, "SELECT pgq.next_batch('q', 'c')")
    one(sql, "SELECT pgq.finish_batch(%s)", batch)
    # pgqd's round: the operations listed, each in its own transaction
    for _ in range(2):
        for func, arg in sql.execute("SELECT * FROM pgq.maint_operations()").fetchall():
            if func != "vacuum":
                sql.execute(f"SELECT {func}({'%s' if arg is not None else ''})", (arg,) if arg is not None else ())
        sql.execute("UPDATE conveyor.streams SET switch_time = now() - interval '1 minute'")
    assert one(sql, "SELECT queue_cur_table FROM pgq.get_queue_info('q')") != 0
    one(sql, "SELECT pgq.insert_event('q', 't', 'after')")
    tick(sql, "q")
    batch = one(sql, "SELECT pgq.next_batch('q', 'c')")
    assert [r[0] for r in sql.execute("SELECT ev_data FROM pgq.get_batch_events(%s)", (batch,))] == ["after"]
    assert one(sql, "SELECT pgq.current_event_table('q')").startswith("conveyor.stream_")


def test_bulk_insert_into_current_event_table(sql):
    one(sql, "SELECT pgq.create_queue('q')")
    one(sql, "SELECT pgq.register_consumer('q', 'c')")
    assert error_of(sql, "SELECT pgq.current_event_table('nope')") == "Event queue not found"
    with sql.transaction():
        table = one(sql, "SELECT pgq.current_event_table('q')")
        sql.execute(f"INSERT INTO {table} (ev_type, ev_data) VALUES ('bulk', 'one'), ('bulk', 'two')")
    tick(sql, "q")
    batch = one(sql, "SELECT pgq.next_batch('q', 'c')")
    assert sql.execute("SELECT ev_type, ev_data FROM pgq.get_batch_events(%s)", (batch,)).fetchall() == [
        ("bulk", "one"), ("bulk", "two")]


# -- skytools' pgq package, unmodified ----------------------------------------------------


def _libpq(dsn: str) -> str:
    return conninfo.make_conninfo(dsn)


class Recorder(pgq.Consumer):  # type: ignore[misc]
    """A PgQ consumer as users write them: process_batch, tag_retry for failures."""

    seen: list[tuple[str, str | None, int | None]]

    def process_batch(self, db: Any, batch_id: int, ev_list: Any) -> None:
        for ev in ev_list:
            self.seen.append((ev.data, ev.extra1, ev.retry))
            if ev.data.startswith("fail") and not ev.retry:
                ev.tag_retry(0)
            else:
                ev.tag_done()


def _consumer(tmp_path: Path, dsn: str, name: str, extra: str = "") -> Recorder:
    ini = tmp_path / f"{name}.ini"
    ini.write_text(f"[{name}]\njob_name = {name}\nqueue_name = jobs\nsrc_db = {_libpq(dsn)}\n"
                   f"logfile = {tmp_path}/{name}.log\npidfile = {tmp_path}/{name}.pid\n{extra}")
    consumer = Recorder(name, "src_db", [str(ini)])
    consumer.seen = []
    return consumer


def _drain(consumer: Recorder, sql: psycopg.Connection[Any]) -> None:
    tick(sql, "jobs")
    while consumer.work():
        pass


@pytest.mark.parametrize("extra", ["", "pgq_lazy_fetch = 0\n"], ids=["cursor", "get_batch_events"])
def test_skytools_consumer_end_to_end(tmp_path, db, sql, extra):
    one(sql, "SELECT pgq.create_queue('jobs')")
    consumer = _consumer(tmp_path, db, "recorder", extra)
    assert consumer.register_consumer() == 1
    producer = psycopg2.connect(_libpq(db))
    try:
        with producer.cursor() as cur:
            pgq.insert_event(cur, "jobs", "job", "ok-1", "public.a")
            pgq.insert_event(cur, "jobs", "job", "fail-1", "public.b")
            pgq.bulk_insert_events(cur, [["job", "ok-2", "public.a"]],
                                   ["type", "data", "extra1"], "jobs")
        producer.commit()
    finally:
        producer.close()
    _drain(consumer, sql)
    assert consumer.seen == [("ok-1", "public.a", None), ("fail-1", "public.b", None), ("ok-2", "public.a", None)]
    assert one(sql, "SELECT count(*) FROM pgq.retry_queue") == 1
    assert one(sql, "SELECT pgq.maint_retry_events()") == 1
    _drain(consumer, sql)
    assert consumer.seen[3:] == [("fail-1", "public.b", 1)]
    info = sql.execute("SELECT pending_events, current_batch FROM pgq.get_consumer_info('jobs', 'recorder')")
    assert info.fetchone() == (0, None)
    consumer.unregister_consumer()
    assert sql.execute("SELECT * FROM pgq.get_consumer_info('jobs')").fetchall() == []


def test_skytools_consumer_table_filter(tmp_path, db, sql):
    """table_filter becomes get_batch_cursor's extra_where."""
    one(sql, "SELECT pgq.create_queue('jobs')")
    consumer = _consumer(tmp_path, db, "filtered", "table_filter = public.a\n")
    consumer.register_consumer()
    for data, table in [("x", "public.a"), ("y", "public.b"), ("z", "public.a")]:
        one(sql, "SELECT pgq.insert_event('jobs', 't', %s, %s, NULL, NULL, NULL)", data, table)
    _drain(consumer, sql)
    assert [s[0] for s in consumer.seen] == ["x", "z"]


def test_events_sent_through_conveyor_reach_pgq_consumers(tmp_path, db, sql):
    one(sql, "SELECT pgq.create_queue('jobs')")
    consumer = _consumer(tmp_path, db, "mixed")
    consumer.register_consumer()
    one(sql, "SELECT conveyor.stream_send('jobs', 'native', 'job', 'public.n')")
    one(sql, "SELECT pgq.insert_event('jobs', 'job', 'dialect')")
    _drain(consumer, sql)
    assert [s[0] for s in consumer.seen] == ["native", "dialect"]


# -- CDC triggers -------------------------------------------------------------------------

TABLE = """
SET timezone = 'Europe/Tallinn';
DROP TABLE IF EXISTS cdc;
CREATE TABLE cdc (id serial PRIMARY KEY, txt text, val float8, flag boolean, n numeric, big int8, small int2,
                  ts timestamp, tstz timestamptz, d date, j json, arr int[], "Odd Col" text, ip inet {extra});
"""

FULL_ROW = ("INSERT INTO cdc (txt, val, flag, n, big, small, ts, tstz, d, j, arr, \"Odd Col\", ip) VALUES "
            "('a b&c=d/ä€\"\\\\', 1.5, true, 1.50, 9000000000, 3, '2020-01-02 03:04:05.678', "
            "'2020-06-01 12:00:00+00', '2020-01-01', '{\"x\": [1,2]}', '{1,NULL,3}', 'x y', '10.0.0.1')")
BASIC = [FULL_ROW, "INSERT INTO cdc DEFAULT VALUES", "UPDATE cdc SET txt = 'zz', flag = false WHERE id = 1",
         "UPDATE cdc SET txt = txt WHERE id = 1", "DELETE FROM cdc WHERE id = 2", "UPDATE cdc SET id = 5"]
IGNORED = ["INSERT INTO cdc (txt, val) VALUES ('a', 1)", "UPDATE cdc SET val = 2 WHERE id = 1",
           "UPDATE cdc SET val = 3, txt = 'b' WHERE id = 1", "UPDATE cdc SET flag = true WHERE id = 1"]
KEYED = ["INSERT INTO cdc (txt) VALUES ('k')", "UPDATE cdc SET val = 5 WHERE id = 1", "DELETE FROM cdc"]
EXPRS = ["INSERT INTO cdc (txt, val) VALUES ('a', 1)", "INSERT INTO cdc (txt, val) VALUES ('b', 2)",
         "UPDATE cdc SET val = 0 WHERE id = 2", "UPDATE cdc SET val = 7 WHERE id = 1", "DELETE FROM cdc WHERE id = 1"]
MAGIC = ["INSERT INTO cdc (txt, _pgq_ev_type, _pgq_ev_extra3) VALUES ('m', 'magic', 'x3')",
         "UPDATE cdc SET txt = 'n', _pgq_ev_type = NULL WHERE id = 1", "DELETE FROM cdc"]

CASES: list[tuple[str, str, list[str], str]] = [
    (trig, "", BASIC, "") for trig in ("jsontriga", "logutriga", "sqltriga")
] + [
    (trig, "backup", BASIC[:4], "") for trig in ("jsontriga", "logutriga", "sqltriga")
] + [
    (trig, "ignore=val,flag", IGNORED, "") for trig in ("jsontriga", "logutriga", "sqltriga")
] + [
    (trig, "pkey=id,txt", KEYED, "") for trig in ("jsontriga", "logutriga", "sqltriga")
] + [
    (trig, "ev_extra3=upper(txt)|ev_type='custom:'||id|when=val > 1", EXPRS, "") for trig in ("jsontriga", "sqltriga")
] + [
    ("logutriga", "ev_extra4=flag|ev_data=null", ["INSERT INTO cdc (txt, flag) VALUES ('a', true)"], ""),
    ("logutriga", "when=txt", ["INSERT INTO cdc (txt) VALUES ('a')"], ""),
    ("jsontriga", "when=NULL::boolean", ["INSERT INTO cdc (txt) VALUES ('a')"], ""),
    ("jsontriga", "bogus", ["INSERT INTO cdc (txt) VALUES ('a')"], ""),
    ("sqltriga", "deny", ["INSERT INTO cdc (txt) VALUES ('a')"], ""),
    ("jsontriga", "SKIP", ["INSERT INTO cdc (txt) VALUES ('a')"], ""),
] + [
    (trig, "", MAGIC, ", _pgq_ev_type text, _pgq_ev_extra3 text") for trig in ("jsontriga", "logutriga", "sqltriga")
] + [
    ("logutriga", "", ["INSERT INTO cdc (txt) VALUES ('a')"], ", _pgq_ev_bogus text"),
]


def _capture(dsn: str, trig: str, args: str, statements: list[str], extra: str, *, before: bool = False,
             nopkey: bool = False, table: str = TABLE) -> list[Any]:
    """Runs the statements on a table with the trigger; returns each statement's outcome
    and then the events appended to queue 'cdc', read from the queue's tables."""
    outcome: list[Any] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(table.format(extra=extra))
        if nopkey:
            conn.execute("ALTER TABLE cdc DROP CONSTRAINT cdc_pkey")
        conn.execute("SELECT pgq.drop_queue(queue_name, true) FROM pgq.queue")
        conn.execute("SELECT pgq.create_queue('cdc')")
        quoted = ", ".join(["'cdc'"] + ["'" + a.replace("'", "''") + "'" for a in args.split("|") if a])
        when = "BEFORE" if before else "AFTER"
        conn.execute(f"CREATE TRIGGER tg {when} INSERT OR UPDATE OR DELETE ON cdc FOR EACH ROW "
                     f"EXECUTE PROCEDURE pgq.{trig}({quoted})")
        for statement in statements:
            try:
                cur = conn.execute(statement)
                outcome.append(("ok", cur.rowcount))
            except psycopg.Error as exc:
                outcome.append(("error", (exc.diag.message_primary or "").split(",")[0]))
        table = one(conn, "SELECT queue_data_pfx FROM pgq.queue WHERE queue_name = 'cdc'")
        outcome += conn.execute(f"SELECT ev_type, ev_data, ev_extra1, ev_extra2, ev_extra3, ev_extra4 FROM {table}"
                                " ORDER BY ev_id").fetchall()
        outcome.append(conn.execute("SELECT count(*) FROM cdc").fetchone())
    return outcome


@pytest.mark.parametrize(("trig", "args", "statements", "extra"), CASES,
                         ids=[f"{c[0]}-{c[1] or 'plain'}-{i}" for i, c in enumerate(CASES)])
def test_cdc_trigger_events_equal_real_pgq(db, real_pgq, trig, args, statements, extra):
    """Event for event, and error for error, what PgQ's C triggers append."""
    before = "SKIP" in args
    ours = _capture(db, trig, args, statements, extra, before=before)
    theirs = _capture(real_pgq, trig, args, statements, extra, before=before)
    assert ours == theirs
    assert len(ours) > len(statements) + 1 or any(o[0] == "error" for o in ours[:len(statements)]) or before


# Columns of every type whose values the dialect reads from the row's JSON (dialect
# migration 0002, pgq._json_text_types), in a time zone with an odd offset and a
# non-ISO date style, with values at their edges.
JSON_TEXT_TABLE = """
SET timezone = 'America/St_Johns';
SET DateStyle = 'SQL, DMY';
DROP TABLE IF EXISTS cdc;
CREATE TABLE cdc (id bigserial PRIMARY KEY, txt text, vc varchar(20), ch char(4), nm name, c "char", flag boolean,
                  small int2, n int4, big int8, num numeric, r real, d double precision, o oid, u uuid, b bytea,
                  iv interval, t time, ttz timetz, dt date, ts timestamp, tstz timestamptz, ip inet, net cidr,
                  mac macaddr {extra});
"""
JSON_TEXT_ROWS = [
    "INSERT INTO cdc (txt, vc, ch, nm, c, flag, small, n, big, num, r, d, o, u, b, iv, t, ttz, dt, ts, tstz, ip, net, mac) "
    "VALUES ('a b&c=d/ä€\"\\\\ %+:,@', '', 'x', 'Name', 'q', true, -32768, 0, 9223372036854775807, 1.50, 'NaN', "
    "-0.0, 42, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x00ff27', '1 day 02:03:04.5', '23:59:59.999999', "
    "'12:00:00-05:30', '0044-03-15 BC', '2020-02-29 03:04:05.678', '2020-06-01 12:00:00+00', '10.0.0.1', "
    "'10.1.0.0/16', '08:00:2b:01:02:03')",
    "INSERT INTO cdc (flag, num, d, dt, ts, tstz) VALUES (false, 'NaN', 'Infinity', 'infinity', '-infinity', "
    "'1999-12-31 23:59:59.5+13')",
    "INSERT INTO cdc DEFAULT VALUES",
    "UPDATE cdc SET txt = 'zz', flag = NOT flag, tstz = tstz + interval '1 second' WHERE id = 1",
    "UPDATE cdc SET r = 1e-10 WHERE id = 2",
    "DELETE FROM cdc WHERE id IN (1, 3)",
]


@pytest.mark.parametrize("args", ["", "backup"])
@pytest.mark.parametrize("trig", ["jsontriga", "logutriga", "sqltriga"])
def test_cdc_events_read_from_the_rows_json_equal_real_pgq(db, real_pgq, trig, args):
    ours = _capture(db, trig, args, JSON_TEXT_ROWS, "", table=JSON_TEXT_TABLE)
    assert ours == _capture(real_pgq, trig, args, JSON_TEXT_ROWS, "", table=JSON_TEXT_TABLE)
    assert len(ours) == len(JSON_TEXT_ROWS) + 7 + 1  # the outcomes, 7 events (one per changed row), the count


@pytest.mark.parametrize(("zone", "style"), [("UTC", "ISO, MDY"), ("Asia/Kathmandu", "Postgres, DMY"),
                                              ("America/St_Johns", "German")])
def test_values_from_the_rows_json_equal_the_dynamic_readers(sql, zone, style):
    """pgq._row_values and pgq._encode_row (0002) against 0001's EXECUTE readers on the same
    rows: the same text, JSON and urlencoding, column for column."""
    sql.execute(JSON_TEXT_TABLE.format(extra=""))
    for row in JSON_TEXT_ROWS[:3]:
        sql.execute(row)
    sql.execute("SELECT set_config('timezone', %s, false), set_config('DateStyle', %s, false)", (zone, style))
    cols = "ARRAY(SELECT attname::text FROM pg_attribute WHERE attrelid = 'cdc'::regclass AND attnum > 0 ORDER BY attnum)"
    types = ("ARRAY(SELECT atttypid::regtype FROM pg_attribute WHERE attrelid = 'cdc'::regclass AND attnum > 0 "
             "ORDER BY attnum)")
    skipped = "array_fill(false, ARRAY[25])"
    compared = sql.execute(
        f"SELECT pgq._row_values({cols}, {types}, w), pgq._row_text({cols}, w), "
        f"pgq._encode_row('logu', {cols}, {types}, {skipped}, w), pgq._encode('logu', {cols}, {skipped}, "
        f"pgq._row_text({cols}, w)), pgq._encode_row('json', {cols}, {types}, {skipped}, w), "
        f"pgq._encode('json', {cols}, {skipped}, pgq._row_json({cols}, {types}, w)) FROM cdc w ORDER BY id").fetchall()
    assert len(compared) == 3
    for fast_text, text, fast_logu, logu, fast_json, json in compared:
        assert (fast_text, fast_logu, fast_json) == (text, logu, json)


def test_cdc_triggers_without_primary_key(db, real_pgq):
    statements = ["INSERT INTO cdc (txt) VALUES ('a')", "UPDATE cdc SET txt = 'b'", "DELETE FROM cdc"]
    for trig in ("jsontriga", "logutriga", "sqltriga"):
        ours = _capture(db, trig, "", statements, "", nopkey=True)
        assert ours == _capture(real_pgq, trig, "", statements, "", nopkey=True)
        assert ours[1:3] == [("error", "Update/Delete on table without pkey")] * 2


def test_cdc_truncate_and_statement_level_misuse(sql):
    one(sql, "SELECT pgq.create_queue('cdc')")
    sql.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql.execute("CREATE TRIGGER tr AFTER TRUNCATE ON t FOR EACH STATEMENT EXECUTE PROCEDURE pgq.logutriga('cdc')")
    sql.execute("CREATE TRIGGER tj AFTER TRUNCATE ON t FOR EACH STATEMENT EXECUTE PROCEDURE pgq.jsontriga('cdc')")
    sql.execute("TRUNCATE t")
    table = one(sql, "SELECT queue_data_pfx FROM pgq.queue")
    assert sql.execute(f"SELECT ev_type, ev_data, ev_extra1 FROM {table} ORDER BY ev_id").fetchall() == [
        ('{"op":"TRUNCATE","table":["public","t"],"pkey":["id"]}', "{}", "public.t"), ("R", "", "public.t")]
    sql.execute("CREATE TRIGGER ts AFTER INSERT ON t FOR EACH STATEMENT EXECUTE PROCEDURE pgq.sqltriga('cdc')")
    assert error_of(sql, "INSERT INTO t VALUES (1, 'x')") == "pgq Ins/Upd/Del trigger must be fired FOR EACH ROW"
    sql.execute("DROP TRIGGER ts ON t")
    sql.execute("CREATE TRIGGER tn AFTER INSERT ON t FOR EACH ROW EXECUTE PROCEDURE pgq.sqltriga()")
    assert error_of(sql, "INSERT INTO t VALUES (1, 'x')") == "pgq trigger must have destination queue as argument"
    sql.execute("DROP TRIGGER tn ON t")
    sql.execute("CREATE TRIGGER tq AFTER INSERT ON t FOR EACH ROW EXECUTE PROCEDURE pgq.sqltriga('no_such_queue')")
    assert error_of(sql, "INSERT INTO t VALUES (1, 'x')") == "No such queue"


def test_cdc_changes_commit_with_the_transaction(db, sql):
    """A change appends its event in the same transaction: rolled back, nothing; the
    consumer reads exactly the committed changes, in commit order."""
    one(sql, "SELECT pgq.create_queue('cdc')")
    one(sql, "SELECT pgq.register_consumer('cdc', 'replica')")
    sql.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int)")
    sql.execute("CREATE TRIGGER cdc AFTER INSERT OR UPDATE OR DELETE ON accounts FOR EACH ROW "
                "EXECUTE PROCEDURE pgq.logutriga('cdc')")
    with sql.transaction():
        sql.execute("INSERT INTO accounts VALUES (1, 100), (2, 200)")
    for statement in ["INSERT INTO accounts VALUES (3, 300)", "UPDATE accounts SET balance = 0 WHERE id = 1",
                      "DELETE FROM accounts WHERE id = 2"]:
        with pytest.raises(psycopg.errors.DivisionByZero), sql.transaction():
            sql.execute(statement)
            sql.execute("SELECT 1/0")
    with sql.transaction():
        sql.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 2")
        with pytest.raises(psycopg.errors.UniqueViolation), sql.transaction():  # a rolled-back savepoint
            sql.execute("INSERT INTO accounts VALUES (4, 400), (4, 400)")
    with sql.transaction():
        sql.execute("DELETE FROM accounts WHERE id = 1")
    tick(sql, "cdc")
    events = []
    while (batch := one(sql, "SELECT pgq.next_batch('cdc', 'replica')")) is not None:
        events += sql.execute("SELECT ev_type, ev_data, ev_extra1 FROM pgq.get_batch_events(%s)", (batch,)).fetchall()
        one(sql, "SELECT pgq.finish_batch(%s)", batch)
    assert events == [("I:id", "id=1&balance=100", "public.accounts"), ("I:id", "id=2&balance=200", "public.accounts"),
                      ("U:id", "id=2&balance=201", "public.accounts"), ("D:id", "id=1&balance=100", "public.accounts")]


def test_cdc_skip_in_before_trigger_and_replica_role(sql):
    one(sql, "SELECT pgq.create_queue('cdc')")
    sql.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql.execute("CREATE TRIGGER skip BEFORE INSERT ON t FOR EACH ROW EXECUTE PROCEDURE pgq.sqltriga('cdc', 'SKIP')")
    sql.execute("INSERT INTO t VALUES (1, 'x')")
    table = one(sql, "SELECT queue_data_pfx FROM pgq.queue")
    assert one(sql, "SELECT count(*) FROM t") == 0
    assert sql.execute(f"SELECT ev_type, ev_data FROM {table}").fetchall() == [("I", "(id,v) values ('1','x')")]
    sql.execute("SET session_replication_role = 'local'")
    sql.execute("INSERT INTO t VALUES (2, 'y')")  # logging off: applied, not recorded
    sql.execute("RESET session_replication_role")
    assert one(sql, "SELECT count(*) FROM t") == 1
    assert one(sql, f"SELECT count(*) FROM {table}") == 1
    sql.execute("DROP TRIGGER skip ON t")
    sql.execute("CREATE TRIGGER bad AFTER INSERT ON t FOR EACH ROW EXECUTE PROCEDURE pgq.sqltriga('cdc', 'SKIP')")
    assert error_of(sql, "INSERT INTO t VALUES (3, 'z')") == "SKIP does not work in AFTER trigger."


def test_install_is_recorded_and_refused_next_to_real_pgq(real_pgq):
    async def attempt() -> None:
        async with pool.connect(real_pgq) as conn:
            await migrate.migrate(conn, dialects=("pgq",))

    with pytest.raises(errors.SchemaMismatch, match="pgq extension is installed"):
        asyncio.run(attempt())
    assert [m.label for m in migrate.migrations("pgq")][:2] == ["pgq/0001_pgq", "pgq/0002_static_appends"]


# -- the rest of skytools' pgq 3.8: LocalConsumer, PGQStatus --------------------------------


class LocalRecorder(pgq.LocalConsumer):  # type: ignore[misc]
    """skytools' LocalConsumer as users write it: events one by one, position in a file."""

    seen: list[str]

    def process_local_event(self, db: Any, batch_id: int, ev: Any) -> None:
        self.seen.append(ev.data)
        ev.tag_done()


@pytest.mark.parametrize("side", ["dialect", "real"])
def test_skytools_local_consumer_tracks_its_tick_in_a_file(tmp_path, db, real_pgq, side):
    dsn = db if side == "dialect" else real_pgq
    queue = f"local_{side}_{tmp_path.name[-6:]}".replace("-", "_")
    with psycopg.connect(dsn, autocommit=True) as conn:
        one(conn, "SELECT pgq.create_queue(%s)", queue)
        ini = tmp_path / "local.ini"
        ini.write_text(f"[local]\njob_name = local\nqueue_name = {queue}\nsrc_db = {_libpq(dsn)}\n"
                       f"logfile = {tmp_path}/local.log\npidfile = {tmp_path}/local.pid\n"
                       f"local_tracking_file = {tmp_path}/local.tick\n")
        consumer = LocalRecorder("local", "src_db", [str(ini)])
        consumer.seen = []
        consumer.register_consumer()
        one(conn, "SELECT pgq.insert_event(%s, 't', 'one')", queue)
        one(conn, "SELECT pgq.force_tick(%s)", queue)
        one(conn, "SELECT pgq.ticker()")
        while consumer.work():
            pass
        tracked = int((tmp_path / "local.tick").read_text().split()[0])
        assert consumer.seen == ["one"]
        assert tracked == one(conn, "SELECT last_tick FROM pgq.get_consumer_info(%s, 'local')", queue)
        consumer.unregister_consumer()
        one(conn, "SELECT pgq.drop_queue(%s)", queue)


def _status(dsn: str, tmp_path: Path) -> list[str]:
    ini = tmp_path / "status.ini"
    ini.write_text(f"[pgqadm]\njob_name = status\ndb = {_libpq(dsn)}\nlogfile = {tmp_path}/status.log\n"
                   f"pidfile = {tmp_path}/status.pid\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        pgq.PGQStatus([str(ini)])
    return [line.split()[0] for line in out.getvalue().splitlines() if line.strip() and not line.startswith("-")]


def test_skytools_pgq_status_shows_what_it_shows_for_pgq(tmp_path, db, fresh_real_pgq):
    real_pgq = fresh_real_pgq
    for dsn in (db, real_pgq):
        with psycopg.connect(dsn, autocommit=True) as conn:
            one(conn, "SELECT pgq.create_queue('watched')")
            one(conn, "SELECT pgq.register_consumer('watched', 'watcher')")
            # PGQStatus prints events per second, which PgQ knows after two ticks with events
            for _ in range(2):
                one(conn, "SELECT pgq.insert_event('watched', 't', 'd')")
                one(conn, "SELECT pgq.force_tick('watched')")
                one(conn, "SELECT pgq.ticker()")
                time.sleep(0.1)
    ours, theirs = _status(db, tmp_path), _status(real_pgq, tmp_path)
    with psycopg.connect(real_pgq, autocommit=True) as conn:
        one(conn, "SELECT pgq.unregister_consumer('watched', 'watcher')")
        one(conn, "SELECT pgq.drop_queue('watched')")
    assert ours == theirs
    assert "watched" in ours
