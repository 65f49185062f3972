"""Writes into queues and streams: a task that fails after staging part of its rows is
retried and its first attempt publishes nothing; a streaming micro-batch that Spark
replays (its commit lost in a crash) is published once."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from pyspark import TaskContext

from spark.helpers import append, sql, tick, value


def _fail_first_attempt(marker: str, after: int) -> Any:
    """A mapPartitions function: partition 0's first attempt dies after ``after`` rows
    (so the writer has already staged and committed some of them), once per test."""

    def run(rows: Any) -> Any:
        context = TaskContext.get()
        for n, row in enumerate(rows):
            if n == after and context.partitionId() == 0 and context.attemptNumber() == 0:
                Path(marker).write_text(str(context.taskAttemptId()))
                raise RuntimeError("first attempt fails on purpose")
            yield row

    return run


def test_a_retried_task_publishes_its_rows_once(spark, dsn, tmp_path):
    sql(dsn, "SELECT conveyor.queue_create('out')")
    marker = tmp_path / "failed-once"
    frame = spark.createDataFrame([(f"m{i}", {"n": str(i)}) for i in range(400)], "body string, attributes map<string,string>")
    frame = frame.repartition(2).rdd.mapPartitions(_fail_first_attempt(str(marker), after=150)).toDF(frame.schema)
    (frame.write.format("conveyor").option("dsn", dsn).option("queue", "out").option("batchSize", "50")
     .mode("append").save())

    assert marker.exists(), "the first attempt did not fail: nothing was retried"
    bodies = [r[0] for r in sql(dsn, "SELECT body FROM conveyor.message_peek('out', 10000)")]
    assert sorted(bodies) == sorted(f"m{i}" for i in range(400))  # each once
    headers = value(dsn, "SELECT headers FROM conveyor.messages WHERE body = 'm7'")
    assert headers == {"n": "7"}
    assert value(dsn, "SELECT count(*) FROM conveyor.pipeline_stage") == 0


def test_batch_write_into_a_stream_keeps_types_and_extras(spark, dsn):
    sql(dsn, "SELECT conveyor.stream_create('audit')")
    frame = spark.createDataFrame([(f"p{i}", "login" if i % 2 else "logout", f"user{i}") for i in range(100)],
                                  "payload string, type string, extra1 string")
    frame.write.format("conveyor").option("dsn", dsn).option("stream", "audit").mode("append").save()
    tick(dsn, "audit")
    rows = sql(dsn, "SELECT ev_data, ev_type, ev_extra1 FROM conveyor.stream_events ORDER BY ev_id")
    assert sorted(rows) == sorted((f"p{i}", "login" if i % 2 else "logout", f"user{i}") for i in range(100))


def test_a_replayed_micro_batch_is_published_once(spark, dsn, tmp_path):
    sql(dsn, "SELECT conveyor.stream_create('src')")
    sql(dsn, "SELECT conveyor.queue_create('copy')")
    checkpoint = tmp_path / "cp"

    def run() -> None:
        frame = (spark.readStream.format("conveyor").option("dsn", dsn).option("stream", "src")
                 .option("consumer", "copier").option("startingPosition", "earliest").load())
        query = (frame.select("payload").writeStream.format("conveyor").option("dsn", dsn).option("queue", "copy")
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        assert query.awaitTermination(120) and query.exception() is None

    append(dsn, "src", [f"a{i}" for i in range(60)])
    run()
    # the driver "crashed" after the sink committed batch 0 and before Spark recorded it:
    # without its commit record, Spark replays batch 0 with the same offsets
    shutil.rmtree(checkpoint / "commits")
    (checkpoint / "commits").mkdir()
    append(dsn, "src", [f"b{i}" for i in range(40)])
    run()
    bodies = [r[0] for r in sql(dsn, "SELECT body FROM conveyor.message_peek('copy', 10000)")]
    assert sorted(bodies) == sorted([f"a{i}" for i in range(60)] + [f"b{i}" for i in range(40)])
    assert value(dsn, "SELECT count(*) FROM conveyor.pipeline_commits") == 2
