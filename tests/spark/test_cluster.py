"""The pipeline on a real Spark cluster (issue 18, item 1): a standalone master and two
workers started from the installed PySpark on loopback (separate JVMs); `pipeline
archive` and `pipeline report`, a batch read and a streaming read through the data
source, run with ``--master spark://...`` give what local mode gives.

What runs on the cluster runs once for the module (``on_cluster``): one ``pipeline
archive --master spark://...`` and one driver process for everything else (a driver
and its two executors are three JVMs to start; six applications were most of this
module's time). Each test then runs its part in local mode and compares."""

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

pytestmark = pytest.mark.long(150)  # seconds on a quiet machine: started first (tests/support/parallel.py)


CONF = ["--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2", "--conf",
        "spark.sql.shuffle.partitions=2", "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.ui.enabled=false",
        # the quick compiler only, as for every JVM of the tests (tests/conftest.py)
        "--conf", "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1"]
PARTITIONS = {"eu": 40, "us": 80, "customer:7": 120, "customer:8": 160}


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


ON_CLUSTER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from conveyor.pipeline import archive, session
    from conveyor.pipeline import report as reports
    from spark import scenarios
    dsn, master, work, between = sys.argv[1:5]
    work = Path(work)
    spark = session.build(master, dict(c.split("=", 1) for c in sys.argv[5:]))
    got = {}
    # the pipeline: the stream's archive (the queue's was archived by the CLI), and the report
    got["orders"] = archive.run(spark, archive.ArchiveJob(dsn=dsn, path=work / "lake" / "orders", stream="orders",
                                                          consumer="on-cluster")).rows
    got["report"] = reports.build(spark, [work / "lake"], dsn).to_json()
    # batch and streaming reads of a queue and a stream
    got["batch"] = sorted(r["body"] for r in spark.read.format("conveyor").option("dsn", dsn)
                          .option("queue", "reads").load().select("body").collect())
    seen = []
    scenarios.collect_stream(spark.readStream.format("conveyor").option("dsn", dsn).option("stream", "feed")
                             .option("consumer", "on-cluster").option("startingPosition", "earliest").load(),
                             work / "feed-checkpoint", seen, lambda rows: [r["payload"] for r in rows])
    got["stream"] = sorted(seen)
    # a partitioned queue's, and sealed payloads opened on the workers
    def load(reader, queue):
        return reader.format("conveyor").option("dsn", dsn).option("partitionedQueue", queue)
    got["pq_batch"] = scenarios.keys(load(spark.read, "pq").option("numPartitions", "3").load().collect())
    got["sealed"] = sorted(json.loads(r["payload"])["n"] for r in load(spark.read, "sealed").load().collect())
    seen = []
    scenarios.collect_stream(load(spark.readStream, "pq").option("startingOffsets", "earliest")
                             .option("maxOffsetsPerTrigger", "100").load(), work / "pq-checkpoint", seen,
                             scenarios.keys)
    got["pq_stream"] = sorted(seen)
    # Kafka's source options
    got["kafka"] = scenarios.run(spark, dsn, work, "cluster", int(between))
    print(json.dumps(got))
    spark.stop()
""")


@pytest.fixture(scope="module")
def on_cluster(cluster: str, module_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every test's data, and what the cluster made of it: the queue archived by the CLI,
    everything else by one driver process."""
    dsn, work = module_dsn, tmp_path_factory.mktemp("on-cluster")
    between = scenarios.setup(dsn)  # first: it ages every tick and partitioned message there is
    # the pipeline's
    sql(dsn, "SELECT conveyor.queue_create('jobs')")
    sql(dsn, "SELECT conveyor.message_send_batch('jobs', array(SELECT 'job ' || i FROM generate_series(1, 500) i))")
    sql(dsn, "SELECT conveyor.message_archive('jobs', array(SELECT i::bigint FROM generate_series(1, 400) i))")
    sql(dsn, "SELECT conveyor.stream_create('orders')")
    append(dsn, "orders", [f"order {i}" for i in range(300)])
    tick(dsn, "orders")
    # the reads'
    sql(dsn, "SELECT conveyor.queue_create('reads')")
    sql(dsn, "SELECT conveyor.message_send_batch('reads', array(SELECT 'm ' || i FROM generate_series(1, 200) i))")
    sql(dsn, "SELECT conveyor.stream_create('feed')")
    append(dsn, "feed", [f"e {i}" for i in range(150)])
    tick(dsn, "feed")
    for partition, count in PARTITIONS.items():
        push(dsn, "pq", partition, [{"n": i, "p": partition} for i in range(count)])
    key = crypto.Keyring.generate("cluster-key")
    keyring = crypto.Keyring.parse(key)
    push(dsn, "sealed", "s", [keyring.seal_text(json.dumps({"n": i})) for i in range(30)], encrypted=True)

    done = _conveyor(dsn, work, "archive", "--queue", "jobs", "--path", str(work / "lake" / "jobs"), "--once",
                     "--master", cluster, *CONF)
    assert done["rows"] == 400, done
    conf = [c for c in CONF if c != "--conf"]
    # the key in the driver's environment only: the workers' has none
    env = {**standalone.env(work), "CONVEYOR_ENCRYPTION_KEY": key,
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", ON_CLUSTER, dsn, cluster, str(work), str(between), *conf],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"between": between, "lake": work / "lake", **json.loads(proc.stdout.strip().splitlines()[-1])}


def test_archive_and_report_on_the_cluster_match_local_mode(on_cluster, spark, module_dsn, tmp_path):
    dsn, lake, local = module_dsn, on_cluster["lake"], tmp_path / "local"
    assert on_cluster["orders"] == 300
    assert archive.run(spark, archive.ArchiveJob(dsn=dsn, path=local / "jobs", queue="jobs")).rows == 400
    assert archive.run(spark, archive.ArchiveJob(dsn=dsn, path=local / "orders", stream="orders",
                                                 consumer="locally")).rows == 300
    for name in ("jobs", "orders"):
        rows = {where: sorted(DeltaTable(str(where / name)).to_pyarrow_table(columns=["id"]).column("id").to_pylist())
                for where in (lake, local)}
        assert rows[lake] == rows[local] and len(rows[local]) == len(set(rows[local]))
        # the executors wrote the files: the same columns, and every file on disk is in the log
        table = DeltaTable(str(lake / name))
        assert table.schema() == DeltaTable(str(local / name)).schema()
        on_disk = {str(p) for p in (lake / name).glob("date=*/*.parquet")}
        assert on_disk == {uri.removeprefix("file://") for uri in table.file_uris()}
    assert _figures(on_cluster["report"]) == _figures(reports.build(spark, [local], dsn).to_json())


def test_batch_and_streaming_reads_on_the_cluster_match_local_mode(on_cluster, spark, module_dsn, tmp_path):
    dsn = module_dsn
    batch = spark.read.format("conveyor").option("dsn", dsn).option("queue", "reads").load()
    seen: list[str] = []
    scenarios.collect_stream(spark.readStream.format("conveyor").option("dsn", dsn).option("stream", "feed")
                             .option("consumer", "locally").option("startingPosition", "earliest").load(),
                             tmp_path / "local-checkpoint", seen, lambda rows: [r["payload"] for r in rows])
    local = {"batch": sorted(r["body"] for r in batch.select("body").collect()), "stream": sorted(seen)}
    assert {"batch": on_cluster["batch"], "stream": on_cluster["stream"]} == local
    assert len(local["batch"]) == 200 and len(local["stream"]) == 150


def test_partitioned_queue_reads_on_the_cluster_match_local_mode(on_cluster, spark, module_dsn, tmp_path):
    """Batch and streaming reads of a partitioned queue on the workers equal local mode's;
    and sealed payloads are opened on the workers with the key only the driver has (the
    workers' environment has none)."""
    assert on_cluster["sealed"] == list(range(30))

    def load(reader):
        return reader.format("conveyor").option("dsn", module_dsn).option("partitionedQueue", "pq")

    seen: list[list] = []
    scenarios.collect_stream(load(spark.readStream).option("startingOffsets", "earliest")
                             .option("maxOffsetsPerTrigger", "100").load(), tmp_path / "local-checkpoint", seen,
                             scenarios.keys)
    local = {"pq_batch": scenarios.keys(load(spark.read).option("numPartitions", "3").load().collect()),
             "pq_stream": sorted(seen)}
    assert {"pq_batch": on_cluster["pq_batch"], "pq_stream": on_cluster["pq_stream"]} == local
    assert len(local["pq_batch"]) == sum(PARTITIONS.values())


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


def test_kafka_source_options_on_the_cluster_and_in_local_mode(on_cluster, spark, module_dsn, tmp_path):
    """Issue 31, part 2: several sources (lists and patterns), starting by time,
    minOffsetsPerTrigger / maxTriggerDelay, includeHeaders, failOnDataLoss and
    Trigger.AvailableNow in rate-limited micro-batches, the same on the cluster and here."""
    _check_kafka_options(on_cluster["kafka"])
    _check_kafka_options(scenarios.run(spark, module_dsn, tmp_path, "local", on_cluster["between"]))
