"""Reads of partitioned queues (Queen's model, migration 0009) through the ``conveyor``
data source, the way Spark reads Kafka topics: a batch read is what was pushed and
consumes nothing; a streaming read keeps a position per partition in Spark's checkpoint,
so a query stopped anywhere and started again reads every message once, partitions
created meanwhile included; a push still in flight holds back only its own partition;
startingOffsets and maxOffsetsPerTrigger behave as Kafka's; bad options are named."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conveyor import crypto
from conveyor.db import queries
from spark.helpers import push, sql, value

pytestmark = pytest.mark.long(40)  # seconds on a quiet machine: started first (tests/support/parallel.py)

Key = tuple[str, int]  # (partition, seq)


def _load(spark: Any, dsn: str, *, stream: bool = False, queue: str = "orders", **options: str) -> Any:
    reader = (spark.readStream if stream else spark.read).format("conveyor").option("dsn", dsn)
    reader = reader.option("partitionedQueue", queue)
    for key, val in options.items():
        reader = reader.option(key, val)
    return reader.load()


def _put(dsn: str, pushed: set[Key], partition: str, n: int) -> list[int]:
    seqs = push(dsn, "orders", partition, [f"{partition}-{uuid.uuid4().hex[:6]}" for _ in range(n)])
    pushed.update((partition, s) for s in seqs)
    return seqs


def _run(spark: Any, dsn: str, checkpoint: Path, **options: str) -> dict[int, list[Key]]:
    """One Trigger.AvailableNow run into foreachBatch: the (partition, seq) of each
    non-empty micro-batch, by batch id."""
    batches: dict[int, list[Key]] = {}

    def collect(frame: Any, batch_id: int) -> None:
        keys = [(r.partition, r.seq) for r in frame.select("partition", "seq").collect()]
        if keys:
            batches[batch_id] = keys

    query = (_load(spark, dsn, stream=True, **options).writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    assert query.awaitTermination(180), "the query did not finish"
    assert query.exception() is None
    return batches


def _all(*runs: dict[int, list[Key]]) -> list[Key]:
    return [k for run in runs for keys in run.values() for k in keys]


def test_batch_read_is_what_was_pushed_and_consumes_nothing(spark, dsn):
    pushed: dict[Key, Any] = {}
    for name, n in (("eu", 120), ("us", 45), ("customer:7", 3)):
        payloads = [{"n": i, "partition": name} for i in range(n)]
        seqs = push(dsn, "orders", name, payloads, producerSub="alice")
        pushed.update(zip(((name, s) for s in seqs), payloads, strict=True))
    trace = str(uuid.uuid4())
    [special] = push(dsn, "orders", "us", [[1, "two", None]], transactionId="tx-1", traceId=trace)
    pushed["us", special] = [1, "two", None]

    frame = _load(spark, dsn, numPartitions="3")
    assert frame.rdd.getNumPartitions() == 3
    assert dict(frame.dtypes) == {
        "queue": "string", "partition": "string", "partition_id": "string", "seq": "bigint", "message_id": "string",
        "transaction_id": "string", "trace_id": "string", "payload": "string", "encrypted": "boolean",
        "producer_sub": "string", "created_at": "timestamp"}
    rows = frame.collect()
    assert len(rows) == len(pushed) and {(r.partition, r.seq): json.loads(r.payload) for r in rows} == pushed
    row = next(r for r in rows if r.transaction_id == "tx-1")
    assert (row.queue, row.partition, row.seq, row.trace_id, row.encrypted) == ("orders", "us", 46, trace, False)
    assert row.partition_id == value(dsn, "SELECT uuid::text FROM conveyor.partitions WHERE name = 'us'")
    assert row.message_id == value(dsn, "SELECT id::text FROM conveyor.partition_messages WHERE transaction_id = 'tx-1'")
    assert {r.producer_sub for r in rows if r.transaction_id != "tx-1"} == {"alice"}

    # a range, Kafka's way: partitions not named run from earliest / to latest
    part = _load(spark, dsn, startingOffsets='{"orders": {"eu": 100}}',
                 endingOffsets='{"orders": {"eu": 110, "us": 2}}').collect()
    assert sorted((r.partition, r.seq) for r in part) == sorted(
        [("eu", s) for s in range(101, 111)] + [("us", 1), ("us", 2)] + [("customer:7", s) for s in (1, 2, 3)])

    # reading left no trace: no consumer group, cursor or lease; a group still gets everything
    assert value(dsn, "SELECT count(*) FROM conveyor.consumer_groups") == 0
    assert value(dsn, "SELECT count(*) FROM conveyor.partition_cursors") == 0
    popped = value(dsn, "SELECT conveyor.pqueue_pop(%s::jsonb)",
                   json.dumps({"queue": "orders", "partition": "us", "consumerGroup": "billing", "batch": 1000}))
    assert len(popped["messages"]) == 46


def test_each_message_once_across_restarts_stops_and_new_partitions(spark, dsn, tmp_path):
    """Into Spark's Parquet sink (exactly once through its own log): runs that drain, a
    run on a timer stopped wherever it is while a producer pushes, new partitions."""
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    pushed: set[Key] = set()
    _put(dsn, pushed, "a", 200)
    _put(dsn, pushed, "b", 50)

    def start(**trigger: Any) -> Any:
        frame = _load(spark, dsn, stream=True, startingOffsets="earliest", maxOffsetsPerTrigger="60",
                      numPartitions="2")
        return (frame.writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
                .trigger(**trigger).start())

    def drain() -> None:
        query = start(availableNow=True)
        assert query.awaitTermination(180) and query.exception() is None

    drain()
    _put(dsn, pushed, "a", 30)
    _put(dsn, pushed, "c", 20)  # created after the query started: read from its first message
    drain()
    query = start(processingTime="250 milliseconds")
    deadline = time.monotonic() + 60
    for round_ in range(8):
        assert time.monotonic() < deadline
        _put(dsn, pushed, "a", 10)
        _put(dsn, pushed, "d" if round_ >= 4 else "b", 5)  # d appears mid-run
        time.sleep(0.3)
    query.stop()  # wherever it is: a micro-batch may be cut short and is replayed on restart
    assert query.exception() is None
    _put(dsn, pushed, "e", 7)
    drain()

    keys = [(r.partition, r.seq) for r in spark.read.parquet(out).select("partition", "seq").collect()]
    assert len(keys) == len(set(keys)), [k for k, n in Counter(keys).items() if n > 1][:10]
    assert set(keys) == pushed
    assert {p for p, _ in keys} == {"a", "b", "c", "d", "e"}


def test_a_replayed_micro_batch_reads_the_same_messages(spark, dsn, tmp_path):
    """Spark replays the last micro-batch its commit log lacks (a driver crash between
    the sink and the log): the offsets in the checkpoint must name the same messages."""
    checkpoint = tmp_path / "checkpoint"
    pushed: set[Key] = set()
    _put(dsn, pushed, "a", 100)
    _put(dsn, pushed, "b", 60)
    options = {"startingOffsets": "earliest", "maxOffsetsPerTrigger": "50", "numPartitions": "2"}
    first = _run(spark, dsn, checkpoint, **options)
    assert len(first) >= 4 and sorted(_all(first)) == sorted(pushed)
    last = max(first)
    for name in (str(last), f".{last}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    _put(dsn, pushed, "a", 20)
    _put(dsn, pushed, "c", 10)
    second = _run(spark, dsn, checkpoint, **options)
    assert sorted(second[last]) == sorted(first[last])  # the replay: same batch id, same messages
    del second[last]
    everything = _all(first, second)
    assert len(everything) == len(set(everything)) and set(everything) == pushed


def test_a_push_in_flight_holds_back_only_its_partition(spark, dsn, tmp_path):
    """The sequence gap: a producer holds position 11 of partition a in an open
    transaction. Position 12 cannot commit before it (pushes to a partition take its row
    lock and number from its head), so a micro-batch that runs meanwhile stops a at 10,
    reads b on, and the next one gets 11 and 12: none skipped, none twice."""
    checkpoint = tmp_path / "checkpoint"
    pushed: set[Key] = set()
    _put(dsn, pushed, "a", 10)
    _put(dsn, pushed, "b", 10)
    first = _run(spark, dsn, checkpoint, startingOffsets="earliest")
    with psycopg.connect(dsn) as slow:  # a transaction left open
        answer = slow.execute("SELECT conveyor.pqueue_push(%s::jsonb)",
                              [json.dumps([{"queue": "orders", "partition": "a", "payload": "slow"}])]).fetchone()
        assert answer is not None and answer[0][0]["seq"] == 11
        later = threading.Thread(target=_put, args=(dsn, pushed, "a", 1))  # waits for the slow one
        later.start()
        _put(dsn, pushed, "b", 5)  # another partition: not held up
        held = _run(spark, dsn, checkpoint)
        assert later.is_alive(), "a second push to the partition did not wait for the first"
        slow.commit()
    later.join(30)
    pushed.add(("a", 11))
    rest = _run(spark, dsn, checkpoint)
    assert sorted(_all(held)) == [("b", s) for s in range(11, 16)]
    assert sorted(_all(rest)) == [("a", 11), ("a", 12)]
    everything = _all(first, held, rest)
    assert len(everything) == len(set(everything)) and set(everything) == pushed


def test_starting_offsets_latest_earliest_and_json(spark, dsn, tmp_path):
    pushed: set[Key] = set()
    _put(dsn, pushed, "a", 10)
    _put(dsn, pushed, "b", 10)
    assert _run(spark, dsn, tmp_path / "latest") == {}  # the default: from now on
    _put(dsn, pushed, "a", 3)
    _put(dsn, pushed, "c", 2)
    assert sorted(_all(_run(spark, dsn, tmp_path / "latest"))) == [("a", 11), ("a", 12), ("a", 13), ("c", 1), ("c", 2)]
    named = _run(spark, dsn, tmp_path / "json", startingOffsets='{"orders": {"a": 8, "c": -1}}')
    assert sorted(_all(named)) == sorted([("a", s) for s in range(9, 14)] + [("b", s) for s in range(1, 11)])
    assert sorted(_all(_run(spark, dsn, tmp_path / "earliest", startingOffsets="earliest"))) == sorted(pushed)


def test_max_offsets_per_trigger_spreads_over_partitions(spark, dsn, tmp_path):
    pushed: set[Key] = set()
    for name, n in (("a", 100), ("b", 50), ("c", 10)):
        _put(dsn, pushed, name, n)
    batches = _run(spark, dsn, tmp_path / "cp", startingOffsets="earliest", maxOffsetsPerTrigger="40")
    # 160 waiting, 40 a batch, in proportion: a 25, b 12.5 -> 12, c 2.5 -> 2
    assert Counter(p for p, _ in batches[min(batches)]) == {"a": 25, "b": 12, "c": 2}
    assert all(len(keys) <= 40 for keys in batches.values())
    everything = _all(batches)
    assert len(everything) == len(set(everything)) and set(everything) == pushed


def test_sealed_payloads_need_the_drivers_key(spark, dsn):
    """Encryption at rest: payloads are opened with the driver's CONVEYOR_ENCRYPTION_KEY
    (tests/spark/test_cluster.py reads them so on a cluster); this session has none for
    this key, and the read fails rather than hand over ciphertext."""
    keyring = crypto.Keyring.parse(crypto.Keyring.generate(f"k{uuid.uuid4().hex[:8]}"))
    push(dsn, "orders", "a", ["clear"])
    push(dsn, "orders", "a", [keyring.seal_text('{"secret": 1}')], encrypted=True)
    with pytest.raises(Exception, match="CONVEYOR_ENCRYPTION_KEY"):
        _load(spark, dsn).collect()


@pytest.mark.parametrize(("options", "message"), [
    ({"queue": "orders"}, "exactly one of the options queue, stream and partitionedQueue"),
    ({"partitionedQueue": "missing"}, "partitioned queue 'missing' does not exist"),
    ({"startingOffsets": "latest"}, "startingOffsets cannot be latest"),
    ({"startingOffsets": '{"orders": {"a": -1}}'}, "startingOffsets cannot be latest"),
    ({"startingOffsets": '{"other": {"a": 1}}'}, "must be earliest or latest or a JSON object"),
    ({"startingOffsets": '{"orders": {"nope": 1}}'}, "names partition 'nope'"),
    ({"startingOffsets": '{"orders": {"a": 99}}'}, "partition 'a' of 'orders' has no message 99 yet"),
    ({"endingOffsets": "earliest"}, "endingOffsets cannot be earliest"),
    ({"startingOffsets": '{"orders": {"a": 5}}', "endingOffsets": '{"orders": {"a": 2}}'},
     r"endingOffsets \(2\) is before startingOffsets \(5\)"),
    ({"startingPosition": "earliest"}, "option startingPosition is not one of a partitioned queue's"),
    ({"kind": "archive"}, "option kind must be one of messages for a partitioned queue"),
    ({"maxOffsetsPerTrigger": "0"}, "option maxOffsetsPerTrigger must be at least 1"),
])
def test_bad_batch_options_are_named(spark, dsn, options, message):
    push(dsn, "orders", "a", list(range(10)))
    reader = spark.read.format("conveyor").option("dsn", dsn)
    for key, val in {"partitionedQueue": "orders", **options}.items():
        reader = reader.option(key, val)
    with pytest.raises(Exception, match=message):
        reader.load().collect()


def test_partitioned_options_elsewhere_and_writes_are_refused(spark, dsn):
    sql(dsn, "SELECT conveyor.queue_create('jobs')")
    with pytest.raises(Exception, match="option startingOffsets is for partitioned queues"):
        spark.read.format("conveyor").option("dsn", dsn).option("queue", "jobs").option(
            "startingOffsets", "earliest").load().collect()
    frame = spark.createDataFrame([("x",)], "payload string")
    with pytest.raises(Exception, match="does not write them"):
        frame.write.format("conveyor").option("dsn", dsn).option("partitionedQueue", "orders").mode("append").save()


def test_bad_streaming_starts_are_named(spark, dsn, tmp_path):
    push(dsn, "orders", "a", list(range(10)))

    def fails(checkpoint: Path, message: str, **options: str) -> None:
        with pytest.raises(Exception, match=message):  # when the query starts, or in its first batch
            query = (_load(spark, dsn, stream=True, **options).writeStream.foreachBatch(lambda frame, batch: None)
                     .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
            query.awaitTermination(120)

    fails(tmp_path / "ending", "endingOffsets is for batch reads", endingOffsets="latest")
    # a checkpoint of a queue that was dropped and created again since
    _run(spark, dsn, tmp_path / "cp", startingOffsets="earliest")
    sql(dsn, "SELECT conveyor.pqueue_drop('orders')")
    push(dsn, "orders", "a", list(range(3)))
    fails(tmp_path / "cp", "dropped and created again since")


def test_a_range_reads_an_index_range_of_its_partition(dsn):
    """The executors' query reads each range through the primary key (partition, seq),
    not the whole partition: a micro-batch of a long partition costs its own rows."""
    for _ in range(4):
        push(dsn, "orders", "long", list(range(5000)))
    push(dsn, "orders", "short", list(range(100)))
    sql(dsn, "ANALYZE conveyor.partition_messages")
    ids = [value(dsn, "SELECT id FROM conveyor.partitions WHERE name = %s", name) for name in ("long", "short")]
    params = {"partition_ids": ids, "afters": [15000, 10], "throughs": [15050, 20]}
    with psycopg.connect(dsn) as conn:
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + queries.get("pipeline_pqueue_range"), params))
    assert "partition_messages_pkey" in plan and "seq > r.after_seq" in plan, plan
