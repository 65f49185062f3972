"""Streaming reads of a stream as a named consumer: offsets are ticks, each micro-batch is
the events between two ticks, a restart from the checkpoint goes on where the last run
stopped, and events whose transactions commit out of id order are neither lost nor
repeated (the pitfall of offsets by max(id)). The killed-driver case is in
tests/pipeline/test_archive.py."""

from __future__ import annotations

from typing import Any

import psycopg

from spark.helpers import append, sql, tick, value


def _run(spark: Any, dsn: str, checkpoint: str, **options: str) -> list[list[int]]:
    """One Trigger.AvailableNow run; the ids of each non-empty micro-batch."""
    batches: list[list[int]] = []
    reader = spark.readStream.format("conveyor").option("dsn", dsn).option("stream", "orders")
    for key, val in options.items():
        reader = reader.option(key, val)

    def collect(frame: Any, batch_id: int) -> None:
        ids = [r.id for r in frame.select("id").collect()]
        if ids:
            batches.append(ids)

    query = (reader.load().writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120), "the query did not finish"
    assert query.exception() is None
    return batches


def test_each_event_once_across_restarts_and_out_of_order_commits(spark, dsn, tmp_path):
    sql(dsn, "SELECT conveyor.stream_create('orders')")
    checkpoint = str(tmp_path / "checkpoint")
    options = {"consumer": "spark", "startingPosition": "earliest", "maxEventsPerTrigger": "100",
               "numPartitions": "2"}
    first = append(dsn, "orders", [f"a{i}" for i in range(250)])
    start = value(dsn, "SELECT max(tick_id) FROM conveyor.stream_ticks")
    tick(dsn, "orders")
    batches = _run(spark, dsn, checkpoint, **options)
    assert sorted(i for b in batches for i in b) == first

    # out of order: a transaction takes an id, another commits a higher one, a tick
    # passes, then the first commits. Both arrive, once each, in later micro-batches.
    with psycopg.connect(dsn) as slow:
        slow_id = slow.execute("SELECT conveyor.stream_send('orders', 'slow')").fetchone()[0]
        fast = append(dsn, "orders", ["fast"])
        tick(dsn, "orders")
        seen = _run(spark, dsn, checkpoint, **options)
        slow.commit()
    assert fast[0] > slow_id and sorted(i for b in seen for i in b) == fast
    later = append(dsn, "orders", [f"c{i}" for i in range(30)])
    rest = _run(spark, dsn, checkpoint, **options)  # AvailableNow ticks whatever is pending
    assert sorted(i for b in rest for i in b) == sorted([slow_id, *later])

    everything = [i for run in (batches, seen, rest) for b in run for i in b]
    assert len(everything) == len(set(everything)) == 250 + 1 + 1 + 30
    # the consumer's position followed the query (commit() comes one micro-batch late)
    assert value(dsn, "SELECT last_tick FROM conveyor.stream_consumers WHERE name = 'spark'") > start


def test_max_events_per_trigger_splits_a_backlog(spark, dsn, tmp_path):
    sql(dsn, "SELECT conveyor.stream_create('orders')")
    ids: list[int] = []
    for round_ in range(4):
        ids += append(dsn, "orders", [f"{round_}-{i}" for i in range(50)])
        tick(dsn, "orders")
    batches = _run(spark, dsn, str(tmp_path / "cp"), consumer="spark", startingPosition="earliest",
                   maxEventsPerTrigger="100")
    assert [len(b) for b in batches] == [100, 100]
    assert sorted(i for b in batches for i in b) == ids
