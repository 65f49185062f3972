"""Batch reads through the ``conveyor`` data source, against a real PostgreSQL: live
queue messages (without claiming them), a queue's archive, its dead letters, a stream's
events over a tick range and a stream's dead letters, each split into several partitions
by id range; and the errors a user gets for bad options."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from spark.helpers import append, sql, tick, value


def _read(spark: Any, dsn: str, **options: str) -> Any:
    reader = spark.read.format("conveyor").option("dsn", dsn).option("numPartitions", "3")
    for key, val in options.items():
        reader = reader.option(key, val)
    return reader.load()


def _setup_queue(dsn: str) -> None:
    sql(dsn, "SELECT conveyor.queue_create('jobs-dlq')")
    sql(dsn, """SELECT conveyor.queue_create('jobs', '{"max_receive_count": 1, "dead_letter_queue": "jobs-dlq"}')""")
    sql(dsn, "SELECT conveyor.message_send_batch('jobs', array(SELECT 'job ' || i FROM generate_series(1, 120) i))")
    sql(dsn, """SELECT conveyor.message_send('jobs', 'typed', '{"colour": "red", "size": 3}'::jsonb, 0,
                                            'text/plain')""")
    # 1-30 done (archived), 31-35 received twice: past max_receive_count, so dead-lettered
    sql(dsn, "SELECT conveyor.message_archive('jobs', array(SELECT i::bigint FROM generate_series(1, 30) i))")
    sql(dsn, "SELECT conveyor.message_set_vt('jobs', array(SELECT i::bigint FROM generate_series(36, 121) i), 600)")
    for _ in range(2):
        sql(dsn, "SELECT * FROM conveyor.message_receive('jobs', 0, 10)")


def test_queue_reads_messages_archive_and_dead_letters(spark, dsn):
    _setup_queue(dsn)
    receive_counts = dict(sql(dsn, "SELECT m.id, m.receive_count FROM conveyor.messages m "
                                   "JOIN conveyor.queues q ON q.id = m.queue_id WHERE q.name = 'jobs'"))

    live = _read(spark, dsn, queue="jobs")
    assert live.rdd.getNumPartitions() == 3
    rows = {r.id: r for r in live.collect()}
    assert set(rows) == set(receive_counts) == set(range(36, 122))
    assert {i: r.receive_count for i, r in rows.items()} == receive_counts  # read, not claimed
    typed = rows[121]
    assert (typed.body, typed.content_type, typed.attributes) == ("typed", "text/plain", {"colour": "red", "size": "3"})
    assert typed.queue == "jobs" and isinstance(typed.sent_at, dt.datetime) and len(typed.message_uuid) == 36
    assert dict(live.dtypes) == {
        "queue": "string", "id": "bigint", "message_uuid": "string", "sent_at": "timestamp",
        "visible_at": "timestamp", "receive_count": "int", "first_received_at": "timestamp", "body": "string",
        "content_type": "string", "attributes": "map<string,string>", "group_id": "string", "dedup_id": "string",
        "sender_id": "string", "source_queue": "string"}
    # still there: reading claimed nothing
    assert value(dsn, "SELECT count(*) FROM conveyor.message_receive('jobs', 0, 1000)") == 0  # all invisible

    archive = _read(spark, dsn, queue="jobs", kind="archive").orderBy("id").collect()
    assert [r.id for r in archive] == list(range(1, 31))
    assert {r.outcome for r in archive} == {"completed"} and archive[0].body == "job 1"
    assert all(r.archived_at >= r.sent_at for r in archive)

    dead = _read(spark, dsn, queue="jobs", kind="dead_letters").collect()
    assert sorted(r.body for r in dead) == sorted(f"job {i}" for i in range(31, 36))
    assert {(r.queue, r.source_queue) for r in dead} == {("jobs-dlq", "jobs")}


def test_stream_reads_events_by_tick_range_and_dead_letters(spark, dsn):
    sql(dsn, "SELECT conveyor.stream_create('clicks')")
    sql(dsn, "SELECT conveyor.stream_subscribe('clicks', 'worker')")
    first = append(dsn, "clicks", [f"a{i}" for i in range(100)], "click")
    t1 = tick(dsn, "clicks")
    second = append(dsn, "clicks", [f"b{i}" for i in range(150)], "view")
    second.append(value(dsn, "SELECT conveyor.stream_send('clicks', 'extra', 'view', 'e1', NULL, 'e3')"))
    t2 = tick(dsn, "clicks")
    # a consumer dead-letters one event of the first batch
    batch = value(dsn, "SELECT conveyor.stream_next_batch('clicks', 'worker')")
    sql(dsn, "SELECT conveyor.stream_dead_letter(%s, %s, 'bad')", batch, first[7])
    sql(dsn, "SELECT conveyor.stream_ack(%s)", batch)

    everything = _read(spark, dsn, stream="clicks")
    assert everything.rdd.getNumPartitions() == 3
    assert sorted(r.id for r in everything.collect()) == first + second

    later = _read(spark, dsn, stream="clicks", fromTick=str(t1), toTick=str(t2)).collect()
    assert sorted(r.id for r in later) == second
    extra = next(r for r in later if r.payload == "extra")
    assert (extra.stream, extra.type, extra.attributes) == ("clicks", "view", {"extra1": "e1", "extra3": "e3"})
    assert {r.type for r in later} == {"view"} and extra.retry_count is None

    dead = _read(spark, dsn, stream="clicks", kind="dead_letters").collect()
    assert [(r.event_id, r.consumer, r.reason, r.payload) for r in dead] == [(first[7], "worker", "bad", "a7")]


@pytest.mark.parametrize(("options", "message"), [
    ({"queue": "missing"}, "queue 'missing' does not exist"),
    ({"stream": "missing"}, "stream 'missing' does not exist"),
    ({"queue": "q", "stream": "s"}, "exactly one of the options queue, stream and partitionedQueue"),
    ({"queue": "q", "kind": "events"}, "option kind must be one of messages, archive, dead_letters"),
    ({"queue": "q", "numPartitions": "many"}, "option numPartitions must be an integer"),
    ({"queue": "q", "colour": "red"}, "unknown option 'colour'"),
    ({"queuePattern": "(unclosed"}, "option queuepattern is not a regular expression"),
    ({"queue": "a,,b"}, "option queue must name one or more"),
    ({"queue": "q", "maxTriggerDelay": "soon"}, "option maxTriggerDelay must be a duration"),
    ({"queue": "q", "startingTimestamp": "1"}, "option startingTimestamp is for streams and partitioned queues"),
    ({"partitionedQueue": "p", "startingOffsets": "earliest", "startingTimestamp": "1"},
     "give startingOffsets or a start by time"),
])
def test_bad_options_and_missing_objects_are_named(spark, dsn, options, message):
    with pytest.raises(Exception, match=message):
        _read(spark, dsn, **options).collect()
