"""The pgque dialect: PgQue's SQL interface (seed 001) over Conveyor's streams, driven by
PgQue's own Python client (pgque-py 0.2.2, unmodified) and by SQL, against databases where
Conveyor installed the dialect (migrate(dialects=("pgque",))).

The snapshot rule holds as in PgQue: send, tick and receive each commit before the next
(the client's connections are non-autocommit, so the tests commit between them)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pgque
import psycopg
import pytest
from psycopg import conninfo, sql

from conftest import Databases, create_database, drop_database, unique_name
from conveyor.db import migrate, pool
from dialects import differences
from support.server import ServerProcess

# -- fixtures: a template with the dialect installed, cloned per test ----------------------


@pytest.fixture(scope="module")
def pgque_template(template_db: str) -> Iterator[str]:
    name = unique_name("conveyor_pgque_tpl")
    dsn = create_database(name, template=template_db)

    async def install() -> None:
        async with pool.connect(dsn) as conn:
            await migrate.migrate(conn, dialects=("pgque",))

    asyncio.run(install())
    yield name
    drop_database(name)


@pytest.fixture
def pq_dsn(pgque_template: str, databases: Databases) -> Iterator[str]:
    name = unique_name("conveyor_pgque")
    yield create_database(name, template=pgque_template)
    databases.drop_later(name)  # off the test's path


@pytest.fixture
def db(pq_dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection: every statement is its own transaction."""
    with psycopg.connect(pq_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def client(pq_dsn: str) -> Iterator[pgque.PgqueClient]:
    with pgque.connect(pq_dsn) as c:
        yield c


def one(conn: psycopg.Connection, query: str, *args: Any) -> Any:
    row = conn.execute(query, args).fetchone()
    assert row is not None
    return row[0]


def tick(conn: psycopg.Connection, queue: str) -> int:
    """PgQue's manual ticking idiom, each step its own transaction."""
    one(conn, "SELECT pgque.force_next_tick(%s)", queue)
    tick_id = one(conn, "SELECT pgque.ticker(%s)", queue)
    assert tick_id is not None
    return tick_id


def raises_pgque(conn: psycopg.Connection, query: str, *args: Any) -> str:
    """The primary message of PgQue's error (P0001, as PgQue raises them)."""
    with pytest.raises(psycopg.errors.RaiseException) as info:
        conn.execute(query, args)
    return info.value.diag.message_primary or ""


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError("timed out")
        time.sleep(0.02)
    return time.monotonic() - start


# -- PgQue's client, end to end -----------------------------------------------------------


def test_client_sends_ticks_receives_and_acks(db, client):
    assert one(db, "SELECT pgque.create_queue('orders')") == 1
    assert client.subscribe("orders", "app") == 1
    assert client.subscribe("orders", "app") == 0
    client.conn.commit()

    first = client.send("orders", {"order_id": 1}, type="order.created")
    second = client.send("orders", {"order_id": 2})
    batch_ids = client.send_batch("orders", "order.updated", [{"order_id": 3}, "[4]", None])
    client.conn.commit()
    assert len(batch_ids) == 3 and len({first, second, *batch_ids}) == 5

    assert client.ticker("orders") is None  # 5 events, below ticker_max_count, within ticker_max_lag
    before = client.force_next_tick("orders")
    client.conn.commit()
    made = client.ticker("orders")
    client.conn.commit()
    assert made is not None and made > before

    msgs = client.receive("orders", "app", 10)
    client.conn.commit()
    assert [m.msg_id for m in msgs] == [first, second, *batch_ids]
    assert {m.batch_id for m in msgs} == {msgs[0].batch_id}
    assert [m.type for m in msgs] == ["order.created", "default", "order.updated", "order.updated", "order.updated"]
    assert [m.payload for m in msgs] == ['{"order_id": 1}', '{"order_id": 2}', '{"order_id": 3}', "[4]", "null"]
    assert all(m.retry_count is None and isinstance(m.created_at, datetime) for m in msgs)
    assert client.receive("orders", "app", 10) == msgs  # the open batch again, until acked

    assert client.ack(msgs[0].batch_id) == 1
    assert client.ack(msgs[0].batch_id) == 0  # stale: PgQue answers 0 with a warning
    client.conn.commit()
    tick(db, "orders")
    assert client.receive("orders", "app") == []
    assert client.ticker_all() >= 0
    client.conn.commit()


def test_client_nack_retries_then_dead_letters_and_replays(db, client):
    assert one(db, "SELECT pgque.create_queue('jobs', '{\"max_retries\": 1}'::jsonb)") == 1
    client.subscribe("jobs", "worker")
    client.conn.commit()
    sent = client.send("jobs", {"job": 7}, type="job")
    client.conn.commit()
    tick(db, "jobs")

    (msg,) = client.receive("jobs", "worker")
    client.nack(msg.batch_id, msg, retry_after=0)
    assert client.ack(msg.batch_id) == 1
    client.conn.commit()
    assert one(db, "SELECT pgque.maint()") >= 1  # moves the due retry into the queue
    tick(db, "jobs")
    (again,) = client.receive("jobs", "worker")
    assert (again.msg_id, again.retry_count, again.payload) == (sent, 1, '{"job": 7}')

    client.nack(again.batch_id, again, retry_after=0, reason="upstream timeout")  # 1 >= max_retries: dead
    client.ack(again.batch_id)
    client.conn.commit()
    dead = db.execute("SELECT dl_id, dl_reason, ev_id, ev_retry, ev_type, ev_data FROM pgque.dlq_inspect('jobs')").fetchall()
    assert [d[1:] for d in dead] == [("upstream timeout", sent, 1, "job", '{"job": 7}')]
    # the same dead letter, seen by Conveyor
    assert one(db, "SELECT count(*) FROM conveyor.stream_dead_letters('jobs')") == 1
    one(db, "SELECT pgque.maint()")
    tick(db, "jobs")
    assert client.receive("jobs", "worker") == []  # not retried again
    client.conn.commit()

    replayed = one(db, "SELECT pgque.dlq_replay(%s)", dead[0][0])
    tick(db, "jobs")
    (back,) = client.receive("jobs", "worker")
    assert (back.msg_id, back.retry_count, back.type, back.payload) == (replayed, None, "job", '{"job": 7}')
    client.ack(back.batch_id)
    client.conn.commit()
    assert one(db, "SELECT count(*) FROM pgque.dead_letter") == 0


def test_client_errors_are_pgques(db, client):
    one(db, "SELECT pgque.create_queue('q')")
    with pytest.raises(pgque.PgqueQueueNotFound, match="queue not found: nope"):
        client.send("nope", {"x": 1})
    client.conn.rollback()
    with pytest.raises(pgque.PgqueConsumerNotFound, match="Not subscriber to queue: q/ghost"):
        client.receive("q", "ghost")
    client.conn.rollback()
    with pytest.raises(pgque.PgqueBatchNotFound, match="batch not found: 424242"):
        client.nack(424242, pgque.Message(1, 424242, "t", "{}", None, datetime.now()))
    client.conn.rollback()

    client.subscribe("q", "c")
    client.send_batch("q", "t", [{"n": n} for n in range(5)])
    client.conn.commit()
    tick(db, "q")
    with pytest.raises(pgque.PgqueReceiveOverflowError) as info:
        client.receive("q", "c", 3)  # the whole batch or nothing: ack could not lose events
    assert (info.value.sqlstate, info.value.configured_limit, info.value.operation) == ("54000", 3, "receive")
    client.conn.rollback()
    msgs = client.receive("q", "c", 5)
    assert len(msgs) == 5 and client.ack(msgs[0].batch_id) == 1
    client.conn.commit()


def _consumer_thread(consumer: pgque.Consumer) -> threading.Thread:
    thread = threading.Thread(target=consumer.start, daemon=True)
    thread.start()
    return thread


def _named(dsn: str, app: str) -> str:
    """The DSN with an application name, by which the consumer's connection is found."""
    return conninfo.make_conninfo(dsn, application_name=app)


def _polled(db: psycopg.Connection, app: str) -> Callable[[], bool]:
    """Whether the consumer (its connection named ``app``) is past its LISTEN: it LISTENs
    before its first receive, so from then on a NOTIFY wakes it (one that comes early
    waits in its connection). An empty poll writes nothing, as PgQ's, so its connection's
    last statement tells, not the consumer's last_batch_start."""
    return lambda: bool(one(db, "SELECT count(*) > 0 FROM pg_stat_activity WHERE application_name = %s "
                                "AND query <> '' AND query NOT ILIKE 'LISTEN%%'", app))


def test_a_receive_with_nothing_new_is_a_read(db):
    """An idle consumer's receive writes nothing (PgQue's next_batch, PgQ's, writes only
    when it makes a batch)."""
    one(db, "SELECT pgque.create_queue('idle')")
    one(db, "SELECT pgque.subscribe('idle', 'c')")
    for _ in range(2):
        with db.transaction(force_rollback=True):
            assert db.execute("SELECT * FROM pgque.receive('idle', 'c', 10)").fetchall() == []
            assert one(db, "SELECT pg_current_xact_id_if_assigned()") is None


def test_consumer_is_woken_by_the_ticks_notify(db, client, pq_dsn):
    one(db, "SELECT pgque.create_queue('wake')")
    client.subscribe("wake", "svc")
    client.conn.commit()
    got: list[pgque.Message] = []
    consumer = pgque.Consumer(_named(pq_dsn, "svc-consumer"), queue="wake", name="svc", poll_interval=30,
                              retry_after=0)
    consumer.on("greeting")(got.append)
    thread = _consumer_thread(consumer)
    try:
        wait_for(_polled(db, "svc-consumer"))
        time.sleep(0.3)  # into its 30-second wait
        client.send("wake", {"hello": "world"}, type="greeting")
        client.send("wake", {"no": "handler"}, type="unknown")  # nacked by the consumer: retried
        client.conn.commit()
        started = time.monotonic()
        tick(db, "wake")
        wait_for(lambda: len(got) == 1, timeout=5)
        assert time.monotonic() - started < 3  # NOTIFY, not the 30-second poll
        assert got[0].payload == '{"hello": "world"}'

        # a tick made by Conveyor itself (its ticker, its server) wakes it too
        one(db, "SELECT conveyor.stream_send('wake', '{\"from\": \"conveyor\"}', 'greeting')")
        started = time.monotonic()
        one(db, "SELECT conveyor.stream_force_tick('wake')")
        wait_for(lambda: len(got) == 2, timeout=5)
        assert time.monotonic() - started < 3
        assert got[1].payload == '{"from": "conveyor"}'
        # the consumer acked both batches; the unknown type waits as a retry
        wait_for(lambda: one(db, "SELECT count(*) FROM pgque.consumer_stats() WHERE NOT batch_active") == 1)
        assert one(db, "SELECT count(*) FROM pgque.retry_queue") == 1
    finally:
        consumer.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_a_pgque_queue_is_a_conveyor_stream_over_rest(pgque_template):
    name = unique_name("conveyor_pgque_srv")
    dsn = create_database(name, template=pgque_template)
    server = ServerProcess(dsn, env={"CONVEYOR_DIALECTS": "pgque"}).start()
    try:
        with psycopg.connect(dsn, autocommit=True) as db, pgque.connect(dsn) as client, server.client() as http:
            one(db, "SELECT pgque.create_queue('shared')")
            client.subscribe("shared", "pgque-side")
            client.conn.commit()
            streams = http.get("/v1/streams").json()
            assert "shared" in [s["name"] for s in (streams["streams"] if isinstance(streams, dict) else streams)]
            consumers = http.get("/v1/streams/shared/consumers").json()
            assert "pgque-side" in str(consumers)

            got: list[pgque.Message] = []
            consumer = pgque.Consumer(_named(dsn, "pgque-side-consumer"), queue="shared", name="pgque-side",
                                      poll_interval=30)
            consumer.on("*")(got.append)
            thread = _consumer_thread(consumer)
            try:
                wait_for(_polled(db, "pgque-side-consumer"))
                # produced over REST, ticked by the server's ticker, announced on pgque_shared
                resp = http.post("/v1/streams/shared/events", json={"payload": {"via": "rest"}, "type": "rest.event"})
                assert resp.status_code == 201, resp.text
                wait_for(lambda: len(got) == 1, timeout=8)
                assert (got[0].type, json.loads(got[0].payload), got[0].msg_id) == (
                    "rest.event", {"via": "rest"}, resp.json()["id"])
            finally:
                consumer.stop()
                thread.join(10)
            # and the other way: sent by PgQue's client, received over REST
            http.post("/v1/streams/shared/consumers", json={"name": "rest-side"}).raise_for_status()
            sent = client.send("shared", {"via": "pgque"}, type="pgque.event")
            client.conn.commit()

            def rest_batch() -> bool:
                batch = http.get("/v1/streams/shared/consumers/rest-side/batch", params={"wait": 1}).json()
                return any(e["id"] == sent for e in batch["events"])

            wait_for(rest_batch, timeout=10)
    finally:
        server.kill()
        drop_database(name)


# -- SQL semantics and errors -------------------------------------------------------------


def test_unknown_queue_errors_keep_pgques_texts(db):
    assert raises_pgque(db, "SELECT pgque.subscribe('nope', 'c')") == "Event queue not created yet"
    assert raises_pgque(db, "SELECT pgque.send('nope', 'x')") == "queue not found: nope"
    assert raises_pgque(db, "SELECT pgque.send_batch('nope', ARRAY['x'])") == "queue not found: nope"
    assert raises_pgque(db, "SELECT * FROM pgque.receive('nope', 'c')") == "Not subscriber to queue: nope/c"
    assert raises_pgque(db, "SELECT pgque.drop_queue('nope')") == "No such event queue"
    assert raises_pgque(db, "SELECT pgque.ticker('nope')") == "no such queue"
    assert raises_pgque(db, "SELECT pgque.force_next_tick('nope')") == "queue not found: nope"
    assert raises_pgque(db, "SELECT pgque.set_queue_config('nope', 'max_retries', '1')") == "No such event queue"
    assert one(db, "SELECT pgque.unsubscribe('nope', 'c')") == 0
    assert one(db, "SELECT pgque.dlq_purge('nope')") == 0
    assert db.execute("SELECT * FROM pgque.dlq_inspect('nope')").fetchall() == []
    assert db.execute("SELECT * FROM pgque.dlq_replay_all('nope')").fetchone() == (0, 0, None)
    assert raises_pgque(db, "SELECT pgque.create_queue(NULL)") == "Invalid NULL value"
    assert raises_pgque(db, "SELECT pgque.create_queue(%s)", "q" * 58).startswith("queue name too long: 58 bytes")
    assert raises_pgque(db, "SELECT pgque.dlq_replay(12345)") == "dead letter entry not found: 12345"


def test_subscriptions_and_dropping(db):
    one(db, "SELECT pgque.create_queue('subs')")
    assert [one(db, "SELECT pgque.subscribe('subs', 'a')") for _ in range(2)] == [1, 0]
    assert one(db, "SELECT pgque.register_consumer('subs', 'b')") == 1
    assert one(db, "SELECT count(*) FROM conveyor.consumer_stats() WHERE stream = 'subs'") == 2
    assert raises_pgque(db, "SELECT pgque.drop_queue('subs')") == "cannot drop queue, consumers still attached"
    assert [one(db, "SELECT pgque.unsubscribe('subs', 'a')") for _ in range(2)] == [1, 0]
    assert one(db, "SELECT pgque.drop_queue('subs', true)") == 1
    assert one(db, "SELECT count(*) FROM conveyor.stream_list() WHERE name = 'subs'") == 0


def test_ack_and_nack_of_unknown_batches_and_messages(db):
    one(db, "SELECT pgque.create_queue('b')")
    one(db, "SELECT pgque.subscribe('b', 'c')")
    notices: list[str] = []
    db.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    assert one(db, "SELECT pgque.ack(987654)") == 0
    assert notices == ["finish_batch: batch 987654 not found"]
    message = "ROW(1, 987654, 't', 'x', NULL, now(), NULL, NULL, NULL, NULL)::pgque.message"
    assert raises_pgque(db, f"SELECT pgque.nack(987654, {message})") == "batch not found: 987654"

    one(db, "SELECT pgque.send('b', 'x')")
    tick(db, "b")
    batch = one(db, "SELECT batch_id FROM pgque.receive('b', 'c')")
    message = f"ROW(999999, {batch}, 't', 'x', NULL, now(), NULL, NULL, NULL, NULL)::pgque.message"
    assert raises_pgque(db, f"SELECT pgque.nack({batch}, {message})") == f"msg_id 999999 not found in batch {batch}"
    assert raises_pgque(db, "SELECT * FROM pgque.receive('b', 'c', 0)") == "pgque.receive: max_return must be >= 1, got 0"


def test_nack_past_max_retries_dead_letters_once(db):
    one(db, "SELECT pgque.create_queue('dl', '{\"max_retries\": 0}'::jsonb)")
    one(db, "SELECT pgque.subscribe('dl', 'w')")
    one(db, "SELECT pgque.subscribe('dl', 'other')")
    sent = one(db, "SELECT pgque.send('dl', 'poison', '{\"bad\": true}'::jsonb)")
    tick(db, "dl")
    with db.transaction():
        for _ in range(2):  # idempotent: one dead letter
            nacked = "SELECT pgque.nack(m.batch_id, m, '0 seconds', 'bad payload') FROM pgque.receive('dl', 'w') m"
            assert db.execute(nacked).fetchall() == [(1,)]
        assert one(db, "SELECT pgque.ack(batch_id) FROM pgque.receive('dl', 'w')") == 1
    rows = db.execute("SELECT dl_queue_id, dl_consumer_id, dl_reason, ev_id, ev_retry, ev_txid "
                      "FROM pgque.dlq_inspect('dl')").fetchall()
    consumer_id = one(db, "SELECT sub_consumer FROM pgque.subscription s JOIN pgque.consumer c "
                          "ON c.co_id = s.sub_consumer WHERE c.co_name = 'w'")
    queue_id = one(db, "SELECT queue_id FROM pgque.queue WHERE queue_name = 'dl'")
    assert rows == [(queue_id, consumer_id, "bad payload", sent, None, None)]
    # the other consumer still gets the event: dead letters are per consumer
    (other,) = db.execute("SELECT msg_id FROM pgque.receive('dl', 'other')").fetchall()
    assert other == (sent,)
    stats = db.execute("SELECT dlq_count FROM pgque.queue_stats() WHERE queue_name = 'dl'").fetchone()
    assert stats == (1,)
    assert one(db, "SELECT pgque.dlq_purge('dl', '0 seconds')") == 1


def test_a_retry_is_put_back_once_and_comes_back_to_its_consumer_only(db):
    one(db, "SELECT pgque.create_queue('r')")
    one(db, "SELECT pgque.subscribe('r', 'a')")
    one(db, "SELECT pgque.subscribe('r', 'b')")
    sent = one(db, "SELECT pgque.send('r', 'payload')")
    tick(db, "r")
    for consumer in ("a", "b"):
        with db.transaction():
            if consumer == "a":
                for _ in range(2):  # put back once
                    one(db, "SELECT pgque.nack(m.batch_id, m, '0 seconds') FROM pgque.receive('r', 'a') m")
            one(db, "SELECT pgque.ack(batch_id) FROM pgque.receive('r', %s)", consumer)
    assert one(db, "SELECT count(*) FROM pgque.retry_queue") == 1
    assert one(db, "SELECT pgque.maint_retry_events()") == 1
    tick(db, "r")
    assert db.execute("SELECT msg_id, retry_count FROM pgque.receive('r', 'a')").fetchall() == [(sent, 1)]
    assert db.execute("SELECT msg_id FROM pgque.receive('r', 'b')").fetchall() == []


def test_send_at_delivers_later(db):
    one(db, "SELECT pgque.create_queue('later')")
    one(db, "SELECT pgque.subscribe('later', 'c')")
    entry = one(db, "SELECT pgque.send_at('later', 'remind', '{\"u\": 7}'::jsonb, now() + interval '1 second')")
    now_id = one(db, "SELECT pgque.send_at('later', 'now', '{\"u\": 8}'::jsonb, now() - interval '1 second')")
    assert one(db, "SELECT count(*) FROM pgque.delayed_events WHERE de_id = %s", entry) == 1
    tick(db, "later")
    assert db.execute("SELECT msg_id, type FROM pgque.receive('later', 'c')").fetchall() == [(now_id, "now")]
    one(db, "SELECT pgque.ack(batch_id) FROM pgque.consumer_stats() WHERE queue_name = 'later'")
    assert one(db, "SELECT pgque.maint_deliver_delayed()") == 0  # not due yet
    time.sleep(1.1)
    assert one(db, "SELECT pgque.maint()") >= 1
    tick(db, "later")
    assert db.execute("SELECT type, payload FROM pgque.receive('later', 'c')").fetchall() == [("remind", '{"u": 7}')]


def test_send_batch_rules(db):
    one(db, "SELECT pgque.create_queue('sb')")
    assert one(db, "SELECT pgque.send_batch('nope', ARRAY[]::text[])") == []  # no lookup for nothing
    assert raises_pgque(db, "SELECT pgque.send_batch('sb', NULL::text[])") == "payloads must not be null"
    one(db, "SELECT pgque.subscribe('sb', 'c')")
    ids = one(db, "SELECT pgque.send_batch(queue_name := 'sb', type_name := 't', payloads := ARRAY['1', NULL, '3'])")
    assert ids == sorted(ids) and len(ids) == 3
    with pytest.raises(psycopg.errors.InvalidTextRepresentation), db.transaction():
        db.execute("SELECT pgque.send_batch('sb', ARRAY['{\"ok\": 1}', 'not json']::jsonb[])")  # all or nothing
    one(db, "SELECT pgque.send('sb', 'after')")
    tick(db, "sb")
    got = db.execute("SELECT msg_id, type, payload FROM pgque.receive('sb', 'c')").fetchall()
    assert got[:3] == [(ids[0], "t", "1"), (ids[1], "t", None), (ids[2], "t", "3")]
    assert [r[1:] for r in got[3:]] == [("default", "after")]


def test_queue_config_pause_and_ticker(db):
    one(db, "SELECT pgque.create_queue('cfg', '{\"ticker_max_count\": 2, \"rotation_period\": \"1 hour\"}'::jsonb)")
    info = db.execute("SELECT ticker_max_count, rotation_period FROM conveyor.stream_get('cfg')").fetchone()
    assert info[0] == 2 and info[1].total_seconds() == 3600
    bogus = raises_pgque(db, "SELECT pgque.set_queue_config('cfg', 'bogus', '1')")
    assert bogus == 'cannot change parameter "boguss"'  # PgQue formats it with "%s"
    assert raises_pgque(db, "SELECT pgque.set_queue_config('cfg', 'ticker_max_count', '0')") == (
        "set_queue_config: ticker_max_count must be > 0, got 0")
    one(db, "SELECT pgque.set_queue_config('cfg', 'ticker_max_count', NULL)")  # back to the default
    assert one(db, "SELECT ticker_max_count FROM conveyor.stream_get('cfg')") == 500
    one(db, "SELECT pgque.pause_queue('cfg')")
    assert raises_pgque(db, "SELECT pgque.ticker('cfg')") == "Ticker has been paused for this queue"
    one(db, "SELECT pgque.send('cfg', 'x')")
    one(db, "SELECT pgque.send('cfg', 'y')")
    one(db, "SELECT pgque.send('cfg', 'z')")
    assert one(db, "SELECT pgque.ticker()") == 0  # paused queues are not ticked
    one(db, "SELECT pgque.resume_queue('cfg')")
    one(db, "SELECT pgque.set_queue_config('cfg', 'ticker_max_count', '2')")
    assert one(db, "SELECT pgque.ticker('cfg')") is not None  # 3 events >= 2


def test_observability_functions(db):
    one(db, "SELECT pgque.create_queue('obs')")
    one(db, "SELECT pgque.subscribe('obs', 'fast')")
    one(db, "SELECT pgque.subscribe('obs', 'slow')")
    one(db, "SELECT pgque.send_batch('obs', 't', ARRAY['a', 'b'])")
    tick(db, "obs")
    batch = one(db, "SELECT DISTINCT batch_id FROM pgque.receive('obs', 'fast')")
    flight = db.execute("SELECT consumer_name, batch_id FROM pgque.in_flight('obs')").fetchall()
    assert flight == [("fast", batch)]
    info = db.execute("SELECT queue_name, consumer_name FROM pgque.get_batch_info(%s)", (batch,)).fetchone()
    assert info == ("obs", "fast")
    stats = db.execute("SELECT queue_name, consumers, last_tick_id IS NOT NULL FROM pgque.queue_stats()").fetchall()
    assert stats == [("obs", 2, True)]
    consumers = db.execute("SELECT consumer_name, batch_active FROM pgque.consumer_stats()").fetchall()
    assert consumers == [("fast", True), ("slow", False)]
    checks = {r[0] for r in db.execute("SELECT check_name FROM pgque.queue_health()")}
    assert checks == {"ticker_running", "consumer_lag:fast", "consumer_lag:slow", "rotation_health", "dlq_health"}
    metrics = {r[0] for r in db.execute("SELECT metric_name FROM pgque.otel_metrics()")}
    assert {"pgque.queue.depth", "pgque.consumer.lag_seconds", "pgque.message.dead_lettered"} <= metrics
    assert db.execute("SELECT * FROM pgque.stuck_consumers('0 seconds')").rowcount == 2
    assert [r[0] for r in db.execute("SELECT queue_name FROM pgque.get_queue_info()")] == ["obs"]
    assert [r[1] for r in db.execute("SELECT * FROM pgque.get_consumer_info('obs')")] == ["fast", "slow"]
    assert one(db, "SELECT sum(events) FROM pgque.throughput('obs', '1 hour', '1 minute')") >= 2
    assert db.execute("SELECT * FROM pgque.error_rate('obs', '5 minutes', '1 minute')").rowcount >= 5
    assert one(db, "SELECT pgque.version()") == "0.2.0"


def test_pgq_batch_primitives(db):
    one(db, "SELECT pgque.create_queue('low')")
    one(db, "SELECT pgque.register_consumer('low', 'c')")
    first_tick = one(db, "SELECT max(tick_id) FROM pgque.tick t JOIN pgque.queue q ON q.queue_id = t.tick_queue "
                         "WHERE q.queue_name = 'low'")
    ids = one(db, "SELECT pgque.send_batch('low', 't', ARRAY['1', '2'])")
    tick(db, "low")
    info = db.execute("SELECT batch_id, prev_tick_id, cur_tick_id FROM pgque.next_batch_info('low', 'c')").fetchone()
    assert info[1] == first_tick and info[2] > first_tick
    assert one(db, "SELECT pgque.next_batch('low', 'c')") == info[0]  # the open batch
    events = db.execute("SELECT ev_id, ev_data FROM pgque.get_batch_events(%s)", (info[0],)).fetchall()
    assert events == [(ids[0], "1"), (ids[1], "2")]
    assert one(db, "SELECT pgque.event_retry(%s, %s, 0)", info[0], ids[0]) == 1
    assert one(db, "SELECT pgque.event_retry(%s, %s, 0)", info[0], ids[0]) == 0  # already waiting
    assert one(db, "SELECT pgque.batch_retry(%s, 0)", info[0]) == 1  # the other one
    assert raises_pgque(db, "SELECT pgque.event_retry(%s, 1234567, 0)", info[0]) == "event not found"
    assert one(db, "SELECT pgque.finish_batch(%s)", info[0]) == 1
    # repositioning to an earlier tick: the batch is read again
    assert one(db, "SELECT pgque.register_consumer_at('low', 'c', %s)", first_tick) == 0
    again = one(db, "SELECT pgque.next_batch('low', 'c')")
    assert [r[0] for r in db.execute("SELECT ev_id FROM pgque.get_batch_events(%s)", (again,))] == ids
    assert raises_pgque(db, "SELECT pgque.register_consumer_at('low', 'c', 99999999)") == (
        "cannot reposition, tick not found: 99999999")


def test_ticks_notify_pgques_channel_for_every_ticker(db, pq_dsn):
    one(db, "SELECT pgque.create_queue('chan')")
    long_name = "s" * 70  # a Conveyor stream whose name cannot be a PgQue channel still ticks
    one(db, "SELECT name FROM conveyor.stream_create(%s)", long_name)
    with psycopg.connect(pq_dsn, autocommit=True) as listener:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier("pgque_chan")))
        one(db, "SELECT pgque.send('chan', 'x')")
        ticks = [tick(db, "chan"), one(db, "SELECT conveyor.stream_force_tick('chan')")]
        one(db, "SELECT conveyor.stream_force_tick(%s)", long_name)
        got = [n.payload for n in listener.notifies(timeout=2, stop_after=2)]
    assert got == [str(t) for t in ticks]


def test_roles_split_producers_from_consumers(db, pq_dsn):
    suffix = uuid.uuid4().hex[:8]
    both, writer, reader = (f"pgque_app_{suffix}", f"pgque_prod_{suffix}", f"pgque_cons_{suffix}")
    one(db, "SELECT pgque.create_queue('roles')")
    try:
        for role, grants in ((both, "pgque_reader, pgque_writer"), (writer, "pgque_writer"), (reader, "pgque_reader")):
            db.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE " + grants).format(sql.Identifier(role)))
        as_role = conninfo.make_conninfo
        with pgque.connect(as_role(pq_dsn, user=both)) as app:
            assert app.subscribe("roles", "app") == 1
            app.conn.commit()
            sent = app.send("roles", {"k": 1})
            app.conn.commit()
            tick(db, "roles")
            (msg,) = app.receive("roles", "app")
            assert msg.msg_id == sent and app.ack(msg.batch_id) == 1
            app.conn.commit()
        with psycopg.connect(as_role(pq_dsn, user=writer), autocommit=True) as producer:
            assert one(producer, "SELECT pgque.send('roles', 'x')") > 0
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                producer.execute("SELECT * FROM pgque.receive('roles', 'app')")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                producer.execute("SELECT pgque.create_queue('mine')")
        with psycopg.connect(as_role(pq_dsn, user=reader), autocommit=True) as consumer:
            assert one(consumer, "SELECT count(*) FROM pgque.queue_stats()") == 1
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                consumer.execute("SELECT pgque.send('roles', 'x')")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                consumer.execute("SELECT conveyor.stream_send('roles', 'x')")  # nothing of Conveyor's leaks
        admin_of_both = db.execute("SELECT pg_has_role('pgque_admin', 'pgque_reader', 'member'), "
                                   "pg_has_role('pgque_admin', 'pgque_writer', 'member'), "
                                   "pg_has_role('pgque_writer', 'pgque_reader', 'member')").fetchone()
        assert admin_of_both == (True, True, False)
    finally:
        for role in (both, writer, reader):
            db.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_installing_again_elsewhere_tolerates_the_roles(empty_dsn):
    async def install() -> list[str]:
        async with pool.connect(empty_dsn) as conn:
            await migrate.migrate(conn, dialects=("pgque",))
            return await migrate.installed_dialects(conn)

    assert asyncio.run(install()) == ["pgque"]  # the pgque_* roles exist from the template's install
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert one(conn, "SELECT pgque.create_queue('again')") == 1



# -- cooperative consumers (experimental in PgQue 0.2; pgque-py 0.2.2's receive_coop) -----


def _payloads(msgs: list[pgque.Message]) -> list[str]:
    return [m.payload for m in msgs]


def test_subconsumers_split_the_batches_none_twice(db, pq_dsn):
    one(db, "SELECT pgque.create_queue('coop')")
    c = pgque.connect(pq_dsn, autocommit=True)
    assert [c.subscribe_subconsumer("coop", "w", "a"), c.subscribe_subconsumer("coop", "w", "a"),
            c.subscribe_subconsumer("coop", "w", "b")] == [1, 0, 1]
    for i in range(3):
        c.send("coop", {"i": i})
        tick(db, "coop")
    a, b = c.receive_coop("coop", "w", "a"), c.receive_coop("coop", "w", "b")
    assert (_payloads(a), _payloads(b)) == (['{"i": 0}'], ['{"i": 1}'])
    assert a[0].batch_id != b[0].batch_id
    # a member's open batch comes back to it until acked
    assert [m.batch_id for m in c.receive_coop("coop", "w", "a")] == [a[0].batch_id]
    c.ack(a[0].batch_id)
    third = c.receive_coop("coop", "w", "a")
    assert _payloads(third) == ['{"i": 2}']
    c.ack(third[0].batch_id)
    c.ack(b[0].batch_id)
    assert c.receive_coop("coop", "w", "a") == [] and c.receive_coop("coop", "w", "b") == []
    # the roles PgQue shows; a member shares its main's sub_id
    roles = db.execute("SELECT c.co_name, s.sub_role, s.sub_id FROM pgque.subscription s "
                       "JOIN pgque.consumer c ON c.co_id = s.sub_consumer ORDER BY 1").fetchall()
    assert [(r[0], r[1]) for r in roles] == [("w", "coop_main"), ("w.a", "coop_member"), ("w.b", "coop_member")]
    assert len({r[2] for r in roles}) == 1
    c.close()


def test_concurrent_members_never_take_the_same_batch(db, pq_dsn):
    one(db, "SELECT pgque.create_queue('race')")
    for i in range(40):
        one(db, "SELECT pgque.send('race', %s::jsonb)", f'{{"i": {i}}}')
        tick(db, "race")
    seen: list[str] = []
    lock = threading.Lock()

    def member(sub: str) -> None:
        with pgque.connect(pq_dsn) as c:
            for _ in range(60):
                msgs = c.receive_coop("race", "grp", sub)
                if msgs:
                    c.ack(msgs[0].batch_id)
                c.conn.commit()
                with lock:
                    seen.extend(_payloads(msgs))

    one(db, "SELECT pgque.subscribe_subconsumer('race', 'grp', 'x')")
    one(db, "SELECT pgque.register_consumer_at('race', 'grp', (SELECT min(tick_id) FROM pgque.tick t "
            "JOIN pgque.queue q ON q.queue_id = t.tick_queue WHERE q.queue_name = 'race'))")
    threads = [threading.Thread(target=member, args=(s,)) for s in ("x", "y", "z")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(seen) == sorted(f'{{"i": {i}}}' for i in range(40))


def test_a_retry_by_one_member_comes_back_to_the_group(db, pq_dsn):
    one(db, "SELECT pgque.create_queue('again')")
    c = pgque.connect(pq_dsn, autocommit=True)
    c.subscribe_subconsumer("again", "w", "a")
    c.subscribe_subconsumer("again", "w", "b")
    c.send("again", {"n": 1})
    tick(db, "again")
    msgs = c.receive_coop("again", "w", "a")
    c.nack(msgs[0].batch_id, msgs[0], retry_after=0)
    c.nack(msgs[0].batch_id, msgs[0], retry_after=0)  # once only
    c.ack(msgs[0].batch_id)
    assert one(db, "SELECT count(*) FROM pgque.retry_queue") == 1
    one(db, "SELECT pgque.maint()")
    tick(db, "again")
    back = c.receive_coop("again", "w", "b")
    assert [(m.payload, m.retry_count) for m in back] == [('{"n": 1}', 1)]
    c.close()


def test_receive_coop_overflow_is_typed_and_does_not_advance(db, pq_dsn):
    one(db, "SELECT pgque.create_queue('big')")
    c = pgque.connect(pq_dsn)
    c.subscribe_subconsumer("big", "w", "a")
    c.send_batch("big", "t", [{"n": i} for i in range(3)])
    c.conn.commit()
    tick(db, "big")
    with pytest.raises(pgque.PgqueReceiveOverflowError) as info:
        c.receive_coop("big", "w", "a", max_messages=2)
    assert (info.value.sqlstate, info.value.configured_limit, info.value.operation) == ("54000", 2, "receive_coop")
    assert "larger resource-safe max_return" in info.value.hint
    c.conn.rollback()
    assert one(db, "SELECT count(*) FROM pgque.subscription WHERE sub_batch IS NOT NULL") == 0
    msgs = c.receive_coop("big", "w", "a", max_messages=3)
    assert len(msgs) == 3
    c.ack(msgs[0].batch_id)
    c.conn.commit()
    c.close()


def test_unsubscribing_a_member_with_a_batch(db, pq_dsn):
    one(db, "SELECT pgque.create_queue('leave', '{\"max_retries\": 1}'::jsonb)")
    c = pgque.connect(pq_dsn, autocommit=True)
    c.subscribe_subconsumer("leave", "w", "a")
    c.subscribe_subconsumer("leave", "w", "b")
    c.send("leave", {"n": 1})
    tick(db, "leave")
    c.receive_coop("leave", "w", "a")
    # refused by default, in PgQue's words
    with pytest.raises(pgque.PgqueError, match="cannot unregister active cooperative subconsumer leave/w/a"):
        c.unsubscribe_subconsumer("leave", "w", "a")
    assert raises_pgque(db, "SELECT pgque.unregister_consumer('leave', 'w.a')") == (
        "cannot unregister active cooperative subconsumer without forced batch handling")
    assert raises_pgque(db, "SELECT pgque.unregister_consumer('leave', 'w')") == (
        "cannot unregister cooperative main consumer with registered subconsumers")
    # or its messages go through nack's rule: a retry for the group
    assert c.unsubscribe_subconsumer("leave", "w", "a", batch_handling=1) == 1
    assert c.unsubscribe_subconsumer("leave", "w", "a") == 0
    assert one(db, "SELECT count(*) FROM pgque.retry_queue") == 1
    assert (c.touch_subconsumer("leave", "w", "b"), c.touch_subconsumer("leave", "w", "a")) == (1, 0)
    assert raises_pgque(db, "SELECT pgque.unregister_subconsumer('leave', 'w', 'b', 2)") == (
        "unsupported batch_handling value: 2")
    c.close()


def test_plain_calls_are_refused_for_cooperative_consumers(db, pq_dsn):
    one(db, "SELECT pgque.create_queue('mix')")
    c = pgque.connect(pq_dsn, autocommit=True)
    c.subscribe("mix", "plain")
    # a plain consumer becomes cooperative only when asked
    with pytest.raises(pgque.PgqueError, match="already a normal consumer; explicit conversion is required"):
        c.subscribe_subconsumer("mix", "plain", "a")
    assert one(db, "SELECT pgque.subscribe_subconsumer('mix', 'plain', 'a', true)") == 1
    with pytest.raises(pgque.PgqueError, match="is a cooperative main consumer; use cooperative receive"):
        c.receive("mix", "plain")
    assert "cooperative subconsumer; use receive_coop" in raises_pgque(
        db, "SELECT pgque.next_batch('mix', 'plain.a')")
    assert raises_pgque(db, "SELECT pgque.subscribe_subconsumer('mix', 'x.y', 'a')") == (
        "cooperative consumer name must not contain dot: x.y")
    # the engine refuses the plain batch of either, through any interface
    with pytest.raises(psycopg.Error) as refused:
        db.execute("SELECT conveyor.stream_next_batch('mix', 'plain')")
    assert refused.value.sqlstate == "CVS06"
    c.close()


def test_a_silent_members_batch_is_taken_over_under_a_new_id(db, pq_dsn):
    one(db, "SELECT pgque.create_queue('dead')")
    c = pgque.connect(pq_dsn, autocommit=True)
    c.subscribe_subconsumer("dead", "w", "a")
    c.send("dead", {"n": 1})
    tick(db, "dead")
    old = c.receive_coop("dead", "w", "a")[0].batch_id
    db.execute("UPDATE conveyor.stream_consumers SET active_at = now() - interval '10 minutes' WHERE name = 'w.a'")
    taken = c.receive_coop("dead", "w", "b", dead_interval="1 minute")
    assert _payloads(taken) == ['{"n": 1}'] and taken[0].batch_id != old
    assert c.ack(old) == 0  # the old token is void
    assert c.ack(taken[0].batch_id) == 1
    c.close()


def test_the_coop_consumer_class_consumes_as_a_subconsumer(db, pq_dsn):
    one(db, "SELECT pgque.create_queue('cls')")
    got: list[pgque.Message] = []
    consumer = pgque.Consumer(pq_dsn, queue="cls", name="svc", subconsumer="w1", poll_interval=1)
    consumer.on("job")(got.append)
    thread = _consumer_thread(consumer)
    try:
        wait_for(lambda: one(db, "SELECT count(*) FROM pgque.subscription WHERE sub_role = 'coop_member'") == 1)
        with pgque.connect(pq_dsn) as producer:
            producer.send("cls", {"job": 1}, type="job")
            producer.conn.commit()
        tick(db, "cls")
        wait_for(lambda: len(got) == 1, timeout=10)
        assert got[0].payload == '{"job": 1}'
        wait_for(lambda: one(db, "SELECT count(*) FROM pgque.subscription WHERE sub_batch IS NOT NULL") == 0)
    finally:
        consumer.stop()
        thread.join(10)
    assert not thread.is_alive()


# -- every function of PgQue's SQL -----------------------------------------------------------

PGQUE_FUNCTIONS = Path(__file__).with_name("pgque_0_2_0_functions.txt")


def test_every_pgque_function_is_there_with_pgques_signature(db):
    """Each function of PgQue 0.2.0's SQL, by name and arguments, is in the dialect, or
    listed in expected_differences.toml with the reason it is not."""
    real = [line for line in PGQUE_FUNCTIONS.read_text("utf-8").splitlines() if line and not line.startswith("#")]
    mine = {r[0] for r in db.execute(
        "SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')' FROM pg_proc p "
        "WHERE p.pronamespace = 'pgque'::regnamespace AND p.proname !~ '^_'")}
    differences.check("pgque", "catalog", {sig: sig in mine for sig in real}, dict.fromkeys(real, True))
