"""Kafka's source options, as a Spark user would use them (issue 31, part 2): one
function run in local mode (the test's session) and on the standalone cluster (a child
process), so both give the same answers. The test sets up the shared data (``setup``);
what each run changes (consumers, checkpoints, cleared queues) carries its ``tag``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psycopg
from pyspark.errors import StreamingQueryException

QUEUES, STREAMS, PQUEUES = ("kq_a", "kq_b"), ("ks_a", "ks_b"), ("kp_a", "kp_b")


def _sql(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params or None)
        return cur.fetchall() if cur.description else []


def _push(dsn: str, queue: str, partition: str, payloads: list[Any]) -> None:
    items = [{"queue": queue, "partition": partition, "payload": p} for p in payloads]
    _sql(dsn, "SELECT conveyor.pqueue_push(%s::jsonb)", json.dumps(items))


def setup(dsn: str) -> int:
    """Two queues, two streams, two partitioned queues (and one of each that no pattern
    matches); the first half of each stream's and partitioned queue's data an hour old.
    Returns the time (ms since the epoch) between the old half and the new."""
    for q in (*QUEUES, "other_q"):
        _sql(dsn, "SELECT conveyor.queue_create(%s)", q)
        _sql(dsn, "SELECT conveyor.message_send_batch(%s, array(SELECT %s || i FROM generate_series(1, 5) i))", q, q)
    for s in (*STREAMS, "other_s"):
        _sql(dsn, "SELECT conveyor.stream_create(%s)", s)
        _sql(dsn, "SELECT conveyor.stream_send_batch(%s, 'old', array_fill('old'::text, ARRAY[3]))", s)
        _sql(dsn, "SELECT conveyor.stream_force_tick(%s)", s)
    for p in (*PQUEUES, "other_p"):
        for partition in ("eu", "us"):
            _push(dsn, p, partition, [{"old": i} for i in range(3)])
    _sql(dsn, "UPDATE conveyor.stream_ticks SET tick_time = tick_time - interval '1 hour'")
    _sql(dsn, "UPDATE conveyor.partition_messages SET created_at = created_at - interval '1 hour'")
    between = int((time.time() - 1800) * 1000)
    for s in (*STREAMS, "other_s"):
        _sql(dsn, "SELECT conveyor.stream_send_batch(%s, 'new', array_fill('new'::text, ARRAY[4]))", s)
        _sql(dsn, "SELECT conveyor.stream_force_tick(%s)", s)
    for p in (*PQUEUES, "other_p"):
        for partition in ("eu", "us"):
            _push(dsn, p, partition, [{"new": i} for i in range(4)])
    return between


def _stream(spark: Any, reader: Any, checkpoint: Path, trigger: dict[str, Any] | None = None,
            cols: tuple[str, ...] = ()) -> dict[str, Any]:
    """A streaming query into foreachBatch; the rows (``cols``) and the micro-batches."""
    rows: list[list[Any]] = []
    batches: list[int] = []

    def sink(frame: Any, _: int) -> None:
        got = [[r[c] for c in cols] for r in frame.collect()]
        if got:
            batches.append(len(got))
            rows.extend(got)

    query = (reader.load().writeStream.option("checkpointLocation", str(checkpoint)).foreachBatch(sink)
             .trigger(**(trigger or {"availableNow": True})).start())
    try:
        query.awaitTermination()
        error = None
    except StreamingQueryException as exc:
        error = str(exc)
    return {"rows": sorted(rows), "batches": batches, "error": error}


def keys(rows: Any) -> list[list[Any]]:
    """A partitioned queue's rows as sorted [partition, seq, payload]."""
    return sorted([r["partition"], r["seq"], r["payload"]] for r in rows)


def collect_stream(frame: Any, checkpoint: Path, out: list[Any], pick: Any) -> None:
    """A streaming read run with Trigger.AvailableNow, ``pick(rows)`` of each micro-batch into ``out``."""
    query = (frame.writeStream.option("checkpointLocation", str(checkpoint))
             .foreachBatch(lambda df, _: out.extend(pick(df.collect())))
             .trigger(availableNow=True).start())
    query.awaitTermination()


def run(spark: Any, dsn: str, work: Path, tag: str, between: int) -> dict[str, Any]:
    def fmt(reader: Any) -> Any:
        return reader.format("conveyor").option("dsn", dsn)

    got: dict[str, Any] = {}
    # several sources: a list and a pattern, with the column naming each row's source
    pick = lambda frame, *cols: sorted([r[c] for c in cols] for r in frame.collect())  # noqa: E731
    got["queue_list"] = pick(fmt(spark.read).option("queue", ",".join(QUEUES)).load(), "queue", "body")
    got["queue_pattern"] = pick(fmt(spark.read).option("queuePattern", "kq_.*").load(), "queue", "body")
    got["stream_pattern"] = pick(fmt(spark.read).option("streamPattern", "ks_[ab]").load(), "stream", "type")
    got["pqueue_list"] = pick(fmt(spark.read).option("partitionedQueue", ",".join(PQUEUES)).load(),
                              "queue", "partition", "seq")
    got["stream_pattern_streaming"] = _stream(
        spark, fmt(spark.readStream).option("streamPattern", "ks_.").option("consumer", f"c_{tag}")
        .option("startingPosition", "earliest").option("maxEventsPerTrigger", "6"),
        work / f"several-streams-{tag}", cols=("stream", "type"))
    got["pqueue_pattern_streaming"] = _stream(
        spark, fmt(spark.readStream).option("partitionedQueuePattern", "kp_.").option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "5"), work / f"several-pqueues-{tag}", cols=("queue", "partition", "seq"))
    # starting by time: the new half only (a partition named in startingOffsetsByTimestamp: its own time)
    got["pqueue_since"] = pick(fmt(spark.read).option("partitionedQueue", "kp_a")
                               .option("startingTimestamp", str(between)).load(), "partition", "seq")
    by_partition = json.dumps({"kp_a": {"eu": between}, "kp_b": {"us": 0}})
    got["pqueue_by_partition"] = _stream(
        spark, fmt(spark.readStream).option("partitionedQueue", ",".join(PQUEUES))
        .option("startingOffsetsByTimestamp", by_partition).option("startingTimestamp", str(between)),
        work / f"by-partition-{tag}", cols=("queue", "partition", "seq"))
    got["stream_since"] = _stream(
        spark, fmt(spark.readStream).option("stream", "ks_a").option("consumer", f"t_{tag}")
        .option("startingTimestamp", str(between)), work / f"stream-since-{tag}", cols=("type",))
    # headers: the attributes column, or none
    got["headers"] = [fmt(spark.read).option("queue", "kq_a").option("includeHeaders", flag).load().columns
                      for flag in ("true", "false")]
    # a micro-batch waits for minOffsetsPerTrigger rows until maxTriggerDelay has passed
    started = time.monotonic()
    holding = fmt(spark.readStream).option("partitionedQueue", "kp_b").option("startingOffsets", "earliest")
    holding = holding.option("minOffsetsPerTrigger", "1000").option("maxTriggerDelay", "3s")
    rows: list[int] = []
    query = (holding.load().writeStream.option("checkpointLocation", str(work / f"held-{tag}"))
             .foreachBatch(lambda frame, _: rows.extend(r["seq"] for r in frame.collect()))
             .trigger(processingTime="0.5 seconds").start())
    try:
        deadline = time.monotonic() + 60
        while len(rows) < 14 and time.monotonic() < deadline:
            time.sleep(0.2)
        got["held"] = {"rows": len(rows), "waited": time.monotonic() - started >= 3}
    finally:
        query.stop()
    # failOnDataLoss: messages the checkpoint had not read, cleared away
    lossy = f"kp_loss_{tag}"
    _push(dsn, lossy, "eu", list(range(6)))
    reader = fmt(spark.readStream).option("partitionedQueue", lossy).option("startingOffsets", "earliest")
    first = _stream(spark, reader, work / f"loss-{tag}", cols=("seq",))
    _push(dsn, lossy, "eu", list(range(6, 10)))
    _sql(dsn, "SELECT conveyor.pqueue_clear(%s)", lossy)
    _push(dsn, lossy, "eu", list(range(10, 12)))
    failed = _stream(spark, reader, work / f"loss-{tag}", cols=("seq",))
    went_on = _stream(spark, reader.option("failOnDataLoss", "false"), work / f"loss-{tag}", cols=("seq",))
    got["data_loss"] = {"first": first["rows"], "failed": "data loss: 4 message(s)" in (failed["error"] or ""),
                        "went_on": went_on["rows"], "error": went_on["error"]}
    return got


def expected() -> dict[str, Any]:
    """What every run must give (its tag aside)."""
    bodies = sorted([q, f"{q}{i}"] for q in QUEUES for i in range(1, 6))
    types = sorted([s, t] for s in STREAMS for t in ["old"] * 3 + ["new"] * 4)
    seqs = sorted([p, part, seq] for p in PQUEUES for part in ("eu", "us") for seq in range(1, 8))
    return {"queue_list": bodies, "queue_pattern": bodies, "stream_pattern": types, "pqueue_list": seqs,
            "pqueue_since": sorted([part, seq] for part in ("eu", "us") for seq in range(4, 8)),
            "pqueue_by_partition": sorted([["kp_a", "eu", s] for s in range(4, 8)] + [["kp_a", "us", s] for s in range(4, 8)]
                                          + [["kp_b", "eu", s] for s in range(4, 8)]
                                          + [["kp_b", "us", s] for s in range(1, 8)]),
            "stream_since": [["new"]] * 4,
            "headers_without": "attributes"}
