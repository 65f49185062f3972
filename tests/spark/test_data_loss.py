"""failOnDataLoss for the sources whose loss cannot be made on demand in a Spark query:
a stream's ticks dropped by rotation and a queue's archive marks expired (both deleted
here as rotation and expiry do), through the readers Spark drives. The partitioned
queue's case runs in Spark, locally and on the cluster (tests/spark/test_cluster.py)."""

from __future__ import annotations

import logging

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from conveyor import errors
from conveyor.spark import options, streaming
from spark.helpers import append, sql, tick, value


def _reader(make, dsn: str, **given: str):
    return make(options.parse({"dsn": dsn, **given}))


def test_a_stream_whose_checkpointed_tick_was_rotated_away(dsn, caplog):
    sql(dsn, "SELECT conveyor.stream_create('orders')")
    append(dsn, "orders", ["a", "b"])
    tick(dsn, "orders")
    strict = _reader(streaming.StreamReader, dsn, stream="orders", consumer="c", startingPosition="earliest")
    start = strict.initialOffset()
    read = strict.latestOffset(start, ReadAllAvailable())
    append(dsn, "orders", ["c", "d", "e"])
    tick(dsn, "orders")
    append(dsn, "orders", ["f"])
    newest = tick(dsn, "orders")
    sql(dsn, "DELETE FROM conveyor.stream_ticks t USING conveyor.streams s WHERE s.id = t.stream_id "
             "AND s.name = 'orders' AND t.tick_id < %s", newest - 1)
    with pytest.raises(errors.Conflict, match=r"data loss: the checkpoint has read stream 'orders' up to tick \d+, "
                                              r"but its ticks up to \d+ are gone"):
        strict.latestOffset(read, ReadAllAvailable())
    lenient = _reader(streaming.StreamReader, dsn, stream="orders", consumer="c", failOnDataLoss="false")
    with caplog.at_level(logging.WARNING, logger="conveyor.spark"):
        end = lenient.latestOffset(read, ReadAllAvailable())
        rows = [r for p in lenient.partitions(read, end) for b in lenient.read(p) for r in b.to_pylist()]
    assert [r["payload"] for r in rows] == ["f"]  # what is left after the oldest tick kept
    assert "going on after data loss" in caplog.text


def test_a_queue_archive_whose_checkpointed_mark_expired(dsn):
    sql(dsn, "SELECT conveyor.queue_create('jobs')")
    sql(dsn, "SELECT conveyor.message_send_batch('jobs', array(SELECT 'job ' || i FROM generate_series(1, 6) i))")
    sql(dsn, "SELECT conveyor.message_archive('jobs', array[1, 2]::bigint[])")
    first = value(dsn, "SELECT conveyor.pipeline_archive_mark('jobs', true)")
    sql(dsn, "SELECT conveyor.message_archive('jobs', array[3, 4]::bigint[])")
    second = value(dsn, "SELECT conveyor.pipeline_archive_mark('jobs', true)")
    sql(dsn, "SELECT conveyor.message_archive('jobs', array[5, 6]::bigint[])")
    sql(dsn, "DELETE FROM conveyor.pipeline_marks WHERE mark_id = %s", first)  # as the 7-day expiry does
    checkpoint = {"queue": "jobs", "mark": first}
    strict = _reader(streaming.ArchiveReader, dsn, queue="jobs", kind="archive")
    with pytest.raises(errors.Conflict, match=rf"up to mark {first}, which expired"):
        strict.latestOffset(checkpoint, ReadAllAvailable())
    lenient = _reader(streaming.ArchiveReader, dsn, queue="jobs", kind="archive", failOnDataLoss="false")
    end = lenient.latestOffset(checkpoint, ReadAllAvailable())
    ids = sorted(r["id"] for p in lenient.partitions(checkpoint, end) for b in lenient.read(p) for r in b.to_pylist())
    assert ids == [5, 6] and lenient._kept(second) == second  # from the oldest mark kept on
