"""The pipeline on a real Spark cluster (issue 18, item 1): a standalone master and two
workers started from the installed PySpark on loopback (separate JVMs); `pipeline
archive` and `pipeline report`, a batch read and a streaming read through the data
source, run with ``--master spark://...`` give what local mode gives."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from deltalake import DeltaTable

from conveyor import crypto
from conveyor.pipeline import archive
from conveyor.pipeline import report as reports
from conveyor.spark import standalone
from spark import scenarios
from spark.helpers import append, push, sql, tick

pytestmark = pytest.mark.long(200)  # seconds on a quiet machine: started first (tests/support/parallel.py)


CONF = ["--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2", "--conf",
        "spark.sql.shuffle.partitions=2", "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.ui.enabled=false"]


def _conveyor(dsn: str, tmp: Path, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "conveyor", "--database-url", dsn, "--json", "pipeline", *args],
                          env=standalone.env(tmp), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _figures(report: dict) -> dict:
    """What must not depend on where Spark ran: rows per source, and queue latencies (from
    the database's timestamps; a stream's is measured to when it was archived)."""
    return {(s["kind"], s["name"]): (s["messages"], s["latency_ms"] if s["kind"] == "queue" else None,
                                     s["retried"], s["dead_lettered"]) for s in report["sources"]}


def test_archive_and_report_on_the_cluster_match_local_mode(cluster, spark, dsn, tmp_path):
    sql(dsn, "SELECT conveyor.queue_create('jobs')")
    sql(dsn, "SELECT conveyor.message_send_batch('jobs', array(SELECT 'job ' || i FROM generate_series(1, 500) i))")
    sql(dsn, "SELECT conveyor.message_archive('jobs', array(SELECT i::bigint FROM generate_series(1, 400) i))")
    sql(dsn, "SELECT conveyor.stream_create('orders')")
    append(dsn, "orders", [f"order {i}" for i in range(300)])
    tick(dsn, "orders")
    on_cluster, local = tmp_path / "cluster", tmp_path / "local"
    for name, source in (("jobs", ["--queue", "jobs"]), ("orders", ["--stream", "orders", "--consumer", "on-cluster"])):
        done = _conveyor(dsn, tmp_path, "archive", *source, "--path", str(on_cluster / name), "--once",
                         "--master", cluster, *CONF)
        assert done["rows"] == (400 if name == "jobs" else 300), done
    report = _conveyor(dsn, tmp_path, "report", str(on_cluster), "--out", str(tmp_path / "report"),
                       "--master", cluster, *CONF)
    assert (tmp_path / "report" / "report.html").exists()
    # the same in local mode (this process's session)
    assert archive.run(spark, archive.ArchiveJob(dsn=dsn, path=local / "jobs", queue="jobs")).rows == 400
    assert archive.run(spark, archive.ArchiveJob(dsn=dsn, path=local / "orders", stream="orders",
                                                 consumer="locally")).rows == 300
    for name in ("jobs", "orders"):
        rows = {where: sorted(DeltaTable(str(where / name)).to_pyarrow_table(columns=["id"]).column("id").to_pylist())
                for where in (on_cluster, local)}
        assert rows[on_cluster] == rows[local] and len(rows[local]) == len(set(rows[local]))
        # the executors wrote the files: the same columns, and every file on disk is in the log
        table = DeltaTable(str(on_cluster / name))
        assert table.schema() == DeltaTable(str(local / name)).schema()
        on_disk = {str(p) for p in (on_cluster / name).glob("date=*/*.parquet")}
        assert on_disk == {uri.removeprefix("file://") for uri in table.file_uris()}
    assert _figures(report) == _figures(reports.build(spark, [local], dsn).to_json())


READS = textwrap.dedent("""
    import json, sys
    from conveyor.pipeline import session
    dsn, master, checkpoint, consumer = sys.argv[1:5]
    spark = session.build(master, dict(c.split("=", 1) for c in sys.argv[5:]))
    batch = spark.read.format("conveyor").option("dsn", dsn).option("queue", "reads").load()
    got = {"batch": sorted(r["body"] for r in batch.select("body").collect())}
    seen = []
    query = (spark.readStream.format("conveyor").option("dsn", dsn).option("stream", "feed")
             .option("consumer", consumer).option("startingPosition", "earliest").load()
             .writeStream.option("checkpointLocation", checkpoint)
             .foreachBatch(lambda df, _: seen.extend(r["payload"] for r in df.select("payload").collect()))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    got["stream"] = sorted(seen)
    print(json.dumps(got))
    spark.stop()
""")


def test_batch_and_streaming_reads_on_the_cluster_match_local_mode(cluster, spark, dsn, tmp_path):
    sql(dsn, "SELECT conveyor.queue_create('reads')")
    sql(dsn, "SELECT conveyor.message_send_batch('reads', array(SELECT 'm ' || i FROM generate_series(1, 200) i))")
    sql(dsn, "SELECT conveyor.stream_create('feed')")
    append(dsn, "feed", [f"e {i}" for i in range(150)])
    tick(dsn, "feed")
    conf = [c for c in CONF if c != "--conf"]
    proc = subprocess.run([sys.executable, "-c", READS, dsn, cluster, str(tmp_path / "cluster-checkpoint"),
                           "on-cluster", *conf], env=standalone.env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    on_cluster = json.loads(proc.stdout.strip().splitlines()[-1])
    # the same reads in local mode (this process's session)
    batch = spark.read.format("conveyor").option("dsn", dsn).option("queue", "reads").load()
    seen: list[str] = []
    query = (spark.readStream.format("conveyor").option("dsn", dsn).option("stream", "feed")
             .option("consumer", "locally").option("startingPosition", "earliest").load()
             .writeStream.option("checkpointLocation", str(tmp_path / "local-checkpoint"))
             .foreachBatch(lambda df, _: seen.extend(r["payload"] for r in df.select("payload").collect()))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    local = {"batch": sorted(r["body"] for r in batch.select("body").collect()), "stream": sorted(seen)}
    assert on_cluster == local
    assert len(local["batch"]) == 200 and len(local["stream"]) == 150


PARTITIONED_READS = textwrap.dedent("""
    import json, sys
    from conveyor.pipeline import session
    dsn, master, checkpoint = sys.argv[1:4]
    spark = session.build(master, dict(c.split("=", 1) for c in sys.argv[4:]))
    def load(reader, queue):
        return reader.format("conveyor").option("dsn", dsn).option("partitionedQueue", queue)
    keys = lambda rows: sorted([r["partition"], r["seq"], r["payload"]] for r in rows)
    got = {"batch": keys(load(spark.read, "pq").option("numPartitions", "3").load().collect()),
           "sealed": sorted(json.loads(r["payload"])["n"] for r in load(spark.read, "sealed").load().collect())}
    seen = []
    query = (load(spark.readStream, "pq").option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100")
             .load().writeStream.option("checkpointLocation", checkpoint)
             .foreachBatch(lambda df, _: seen.extend(keys(df.collect())))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    got["stream"] = sorted(seen)
    print(json.dumps(got))
    spark.stop()
""")


def test_partitioned_queue_reads_on_the_cluster_match_local_mode(cluster, spark, dsn, tmp_path):
    """Batch and streaming reads of a partitioned queue on the workers equal local mode's;
    and sealed payloads are opened on the workers with the key only the driver has (the
    workers' environment has none)."""
    for n, partition in enumerate(("eu", "us", "customer:7", "customer:8")):
        push(dsn, "pq", partition, [{"n": i, "p": partition} for i in range(40 * (n + 1))])
    key = crypto.Keyring.generate("cluster-key")
    keyring = crypto.Keyring.parse(key)
    push(dsn, "sealed", "s", [keyring.seal_text(json.dumps({"n": i})) for i in range(30)], encrypted=True)
    conf = [c for c in CONF if c != "--conf"]
    env = {**standalone.env(tmp_path), "CONVEYOR_ENCRYPTION_KEY": key}
    proc = subprocess.run([sys.executable, "-c", PARTITIONED_READS, dsn, cluster, str(tmp_path / "cluster-checkpoint"),
                           *conf], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    on_cluster = json.loads(proc.stdout.strip().splitlines()[-1])
    assert on_cluster.pop("sealed") == list(range(30))
    # the same reads in local mode (this process's session)

    def load(reader):
        return reader.format("conveyor").option("dsn", dsn).option("partitionedQueue", "pq")

    def keys(rows):
        return sorted([r["partition"], r["seq"], r["payload"]] for r in rows)

    seen: list[list] = []
    query = (load(spark.readStream).option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100").load()
             .writeStream.option("checkpointLocation", str(tmp_path / "local-checkpoint"))
             .foreachBatch(lambda df, _: seen.extend(keys(df.collect())))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    local = {"batch": keys(load(spark.read).option("numPartitions", "3").load().collect()), "stream": sorted(seen)}
    assert on_cluster == local
    assert len(local["batch"]) == 40 + 80 + 120 + 160


KAFKA_OPTIONS = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from conveyor.pipeline import session
    from spark import scenarios
    dsn, master, work, between = sys.argv[1:5]
    spark = session.build(master, dict(c.split("=", 1) for c in sys.argv[5:]))
    print(json.dumps(scenarios.run(spark, dsn, Path(work), "cluster", int(between))))
    spark.stop()
""")


def _check_kafka_options(got: dict) -> None:
    want = scenarios.expected()
    for key in ("queue_list", "queue_pattern", "stream_pattern", "pqueue_list", "pqueue_since"):
        assert got[key] == want[key], key
    several = got["stream_pattern_streaming"]
    assert several["rows"] == want["stream_pattern"] and len(several["batches"]) >= 2, several
    several = got["pqueue_pattern_streaming"]
    assert several["rows"] == want["pqueue_list"] and len(several["batches"]) >= 3, several
    assert got["pqueue_by_partition"]["rows"] == want["pqueue_by_partition"]
    assert got["stream_since"]["rows"] == want["stream_since"]
    with_headers, without = got["headers"]
    assert "attributes" in with_headers and "attributes" not in without and len(without) == len(with_headers) - 1
    assert got["held"] == {"rows": 14, "waited": True}
    loss = got["data_loss"]
    assert loss == {"first": [[s] for s in range(1, 7)], "failed": True, "went_on": [[11], [12]], "error": None}, loss


def test_kafka_source_options_on_the_cluster_and_in_local_mode(cluster, spark, dsn, tmp_path):
    """Issue 31, part 2: several sources (lists and patterns), starting by time,
    minOffsetsPerTrigger / maxTriggerDelay, includeHeaders, failOnDataLoss and
    Trigger.AvailableNow in rate-limited micro-batches, the same on the cluster and here."""
    between = scenarios.setup(dsn)
    local = scenarios.run(spark, dsn, tmp_path, "local", between)
    _check_kafka_options(local)
    conf = [c for c in CONF if c != "--conf"]
    env = {**standalone.env(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", KAFKA_OPTIONS, dsn, cluster, str(tmp_path), str(between), *conf],
                          env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    on_cluster = json.loads(proc.stdout.strip().splitlines()[-1])
    _check_kafka_options(on_cluster)
