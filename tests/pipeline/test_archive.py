"""``conveyor pipeline archive``: incremental, exactly once across runs, a killed driver
and killed task attempts, as seen by a reader that is not Spark (delta-rs to pyarrow, and
pyarrow reading exactly the Parquet files the Delta log lists); the rows go from the
tasks to the table, never through the driver."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from conveyor import errors
from conveyor.pipeline import archive
from spark.helpers import append, sql, tick

pytestmark = pytest.mark.long(100)  # seconds on a quiet machine: started first (tests/support/parallel.py)


def _ids(path: Path) -> list[int]:
    """The ids in the table as a non-Spark reader sees them, twice over: delta-rs, and
    plain pyarrow over the files the log lists (the two must agree)."""
    table = DeltaTable(str(path))
    ids = table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    files = [pq.read_table(uri.removeprefix("file://"), columns=["id"]) for uri in table.file_uris()]
    assert sorted(i for f in files for i in f.column("id").to_pylist()) == sorted(ids)
    return ids


def test_queue_archive_is_incremental_and_keeps_out_of_order_commits(spark, dsn, tmp_path):
    sql(dsn, "SELECT conveyor.queue_create('jobs')")
    sql(dsn, "SELECT conveyor.message_send_batch('jobs', array(SELECT 'job ' || i FROM generate_series(1, 300) i))")
    sql(dsn, "SELECT conveyor.message_archive('jobs', array(SELECT i::bigint FROM generate_series(1, 100) i))")
    job = archive.ArchiveJob(dsn=dsn, path=tmp_path / "jobs", queue="jobs")
    first = archive.run(spark, job)
    assert (first.rows, sorted(_ids(job.path))) == (100, list(range(1, 101)))

    # a slow transaction archives low ids, a fast one archives higher ids and commits;
    # the export between them must not skip the slow one once it commits
    with psycopg.connect(dsn) as slow:
        slow.execute("SELECT conveyor.message_archive('jobs', array(SELECT i::bigint FROM generate_series(101, 150) i))")
        sql(dsn, "SELECT conveyor.message_archive('jobs', array(SELECT i::bigint FROM generate_series(200, 220) i))")
        second = archive.run(spark, job)
        slow.commit()
    third = archive.run(spark, job)
    assert (second.rows, third.rows) == (21, 50)
    ids = _ids(job.path)
    assert sorted(ids) == [*range(1, 151), *range(200, 221)] and len(ids) == len(set(ids))
    table = DeltaTable(str(job.path))
    assert table.metadata().partition_columns == ["date"]
    outcome = table.to_pyarrow_table(columns=["outcome", "queue"]).to_pydict()
    assert set(outcome["outcome"]) == {"completed"} and set(outcome["queue"]) == {"jobs"}


def test_a_stream_archive_starts_from_the_oldest_event_kept(spark, dsn, tmp_path):
    """`pipeline archive --stream orders --once` on a stream that already had events
    archived 0 rows: its new consumer started at the latest tick."""
    sql(dsn, "SELECT conveyor.stream_create('orders')")
    before = append(dsn, "orders", [f"old {i}" for i in range(40)])
    tick(dsn, "orders")
    job = archive.ArchiveJob(dsn=dsn, path=tmp_path / "orders", stream="orders")
    assert archive.run(spark, job).rows == 40
    later = append(dsn, "orders", [f"new {i}" for i in range(5)])
    assert archive.run(spark, job).rows == 5
    assert sorted(_ids(job.path)) == sorted(before + later)
    # told otherwise, a new archive takes only what comes after it started
    latest = archive.ArchiveJob(dsn=dsn, path=tmp_path / "latest", stream="orders", consumer="late",
                                starting_position="latest")
    assert archive.run(spark, latest).rows == 0


def _cli(args: list[str], dsn: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "conveyor", "--database-url", dsn, "pipeline", "archive", *args],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)  # its own process group: the JVM goes down with it


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def test_a_killed_driver_loses_and_repeats_nothing(dsn, tmp_path):
    sql(dsn, """SELECT conveyor.stream_create('orders', '{"ticker_max_lag": "0.2 seconds", "ticker_max_count": 200}')""")
    sql(dsn, "SELECT conveyor.pipeline_stream_position('orders', 'conveyor-archive', 'latest')")
    sent: list[int] = []
    stop = threading.Event()

    def produce() -> None:  # appends until both kills are done; bounded in count and time
        deadline = time.monotonic() + 150
        n = 0
        while not stop.is_set() and time.monotonic() < deadline and n < 3000:
            sent.extend(append(dsn, "orders", [f"order {n}-{k}" for k in range(25)]))
            n += 1
            time.sleep(0.05)

    lake = tmp_path / "orders"
    common = ["--stream", "orders", "--path", str(lake), "--master", "local[2]", "--max-events", "300"]
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        # run 1 kills itself with SIGKILL right after micro-batch 2 reached the table,
        # before Spark could record the batch in its checkpoint
        run1 = _cli([*common, "--interval", "0.5"], dsn, CONVEYOR_PIPELINE_FAULT="kill-after-commit:2")
        _, err1 = run1.communicate(timeout=120)
        assert run1.returncode == -signal.SIGKILL, err1[-2000:]
        _kill_group(run1)
        assert DeltaTable(str(lake)).version() >= 2
        # run 2: replays batch 2 (skipped: already in the table), goes on, and is killed
        # from outside in the middle of its work
        run2 = _cli([*common, "--interval", "0.5"], dsn)
        version = DeltaTable(str(lake)).version()
        deadline = time.monotonic() + 90
        while DeltaTable(str(lake)).version() < version + 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        _kill_group(run2)
        err2 = run2.stderr.read() if run2.stderr else ""
        assert "already in the table (replayed after a restart), skipped" in err2, err2[-2000:]
    finally:
        stop.set()
        producer.join(30)
    # run 3 archives whatever is left and stops
    run3 = _cli([*common, "--once", "--json"], dsn)
    out3, err3 = run3.communicate(timeout=120)
    assert run3.returncode == 0, err3[-2000:]
    assert json.loads(out3)["source"] == "stream:orders"

    ids = _ids(lake)
    assert len(ids) == len(set(ids)), "an event was archived twice"
    assert sorted(ids) == sorted(sent), "an event was lost"
    assert len(sent) > 300


def _listed(path: Path) -> set[str]:
    """The files the table's log lists, relative to the table."""
    return {uri.removeprefix("file://").removeprefix(f"{path}/") for uri in DeltaTable(str(path)).file_uris()}


def _on_disk(path: Path) -> set[str]:
    return {p.relative_to(path).as_posix() for p in path.glob("date=*/*.parquet")}


def test_a_killed_task_attempt_leaves_nothing_in_the_table(dsn, tmp_path):
    sql(dsn, "SELECT conveyor.queue_create('jobs')")
    sql(dsn, "SELECT conveyor.message_send_batch('jobs', array(SELECT 'job ' || i FROM generate_series(1, 400) i))")
    sql(dsn, "SELECT conveyor.message_archive('jobs', array(SELECT i::bigint FROM generate_series(1, 400) i))")
    lake = tmp_path / "jobs"
    # two Spark tasks of 200 rows (a micro-batch this small is otherwise the driver's)
    common = ["--queue", "jobs", "--path", str(lake), "--once", "--json", "--partitions", "2", "--rows-per-task", "200"]
    # run 1: the first attempt of both tasks of micro-batch 0 is SIGKILLed once it has
    # written its file (Spark retries the task: local[2,3]); then the driver is killed right
    # after the commit, before it could delete anything
    run1 = _cli([*common, "--master", "local[2,3]"], dsn, CONVEYOR_PIPELINE_FAULT="kill-task:0,kill-after-commit:0")
    _, err1 = run1.communicate(timeout=180)
    assert run1.returncode == -signal.SIGKILL, err1[-2000:]
    _kill_group(run1)
    listed, on_disk = _listed(lake), _on_disk(lake)
    stray = on_disk - listed
    assert len(listed) == 2 and len(stray) == 2, (listed, on_disk)  # a file per killed attempt, not in the log
    assert sorted(_ids(lake)) == list(range(1, 401))  # every reader sees each row once
    # run 2 replays micro-batch 0: already in the table, so skipped, and its stray files go
    run2 = _cli([*common, "--master", "local[2]"], dsn)
    out2, err2 = run2.communicate(timeout=180)
    assert run2.returncode == 0, err2[-2000:]
    done = json.loads(out2)
    assert (done["replayed_batches_skipped"], done["stray_files_removed"], done["rows"]) == (1, 2, 0), done
    assert _on_disk(lake) == _listed(lake) == listed
    assert sorted(_ids(lake)) == list(range(1, 401))


def test_the_driver_collects_descriptions_of_files_not_rows(dsn, tmp_path):
    """A micro-batch of about 12 MB archives with the driver allowed 1 MB of task results
    (spark.driver.maxResultSize): the tasks hand back descriptions of the files they
    wrote, not rows. Collecting the micro-batch to the driver (as before) fails here."""
    sql(dsn, "SELECT conveyor.stream_create('big')")
    sql(dsn, "SELECT count(*) FROM conveyor.stream_send_batch('big', 'default', "
             "array(SELECT md5(i::text) || repeat('x', 568) FROM generate_series(1, 20000) i))")
    tick(dsn, "big")
    lake = tmp_path / "big"
    run = _cli(["--stream", "big", "--path", str(lake), "--once", "--json", "--master", "local[2]",
                "--max-events", "100000", "--rows-per-task", "5000", "--conf", "spark.driver.maxResultSize=1m"], dsn)
    out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err[-3000:]
    done = json.loads(out)
    assert (done["batches"], done["spark_batches"], done["rows"], done["files"]) == (1, 1, 20_000, 4), done
    assert len(set(_ids(lake))) == 20_000


def _as_the_driver_wrote_it(spark, dsn, path: Path, date_from: str, **source: str) -> None:
    """The rows, collected to the driver and written by delta-rs, as the archive did
    before its tasks wrote the files (issue 18)."""
    reader = spark.read.format("conveyor").option("dsn", dsn)
    for key, value in source.items():
        reader = reader.option(key, value)
    data = reader.load().toArrow()
    if "stream" in source:
        stamp = pa.array([dt.datetime.now(dt.UTC)] * data.num_rows, pa.timestamp("us", tz="UTC"))
        data = data.append_column("archived_at", stamp)
    data = data.append_column("date", pc.cast(data.column(date_from), pa.date32()))
    write_deltalake(str(path), data, mode="append", partition_by=["date"])


def test_the_tables_read_as_they_did_and_take_on_where_the_driver_left_off(spark, dsn, tmp_path):
    sql(dsn, "SELECT conveyor.queue_create('jobs')")
    sql(dsn, "SELECT conveyor.message_send_batch('jobs', array(SELECT 'job ' || i FROM generate_series(1, 60) i))")
    sql(dsn, "SELECT conveyor.message_archive('jobs', array(SELECT i::bigint FROM generate_series(1, 40) i))")
    sql(dsn, "SELECT conveyor.stream_create('orders')")
    append(dsn, "orders", [f"order {i}" for i in range(30)])
    tick(dsn, "orders")
    sources = {"jobs": ({"queue": "jobs"}, {"queue": "jobs", "kind": "archive"}, "archived_at"),
               "orders": ({"stream": "orders"}, {"stream": "orders"}, "created_at")}
    for name, (job_source, read_source, date_from) in sources.items():
        new, old = tmp_path / "new" / name, tmp_path / "old" / name
        assert archive.run(spark, archive.ArchiveJob(dsn=dsn, path=new, **job_source)).rows in (40, 30)
        _as_the_driver_wrote_it(spark, dsn, old, date_from, **read_source)
        written, before = DeltaTable(str(new)), DeltaTable(str(old))
        assert written.schema() == before.schema()
        assert written.to_pyarrow_table().schema == before.to_pyarrow_table().schema
        assert written.metadata().partition_columns == before.metadata().partition_columns == ["date"]
        assert written.protocol() == before.protocol()
        # a table the driver wrote takes the tasks' files (a new checkpoint and consumer:
        # every row again)
        again = archive.run(spark, archive.ArchiveJob(dsn=dsn, path=old, checkpoint=tmp_path / f"cp-{name}",
                                                      consumer="again", **job_source))
        after = DeltaTable(str(old))
        assert after.schema() == before.schema() and after.to_pyarrow_table().num_rows == 2 * again.rows > 0
    # a table of another shape is refused, and nothing is committed to it
    version = DeltaTable(str(tmp_path / "new" / "orders")).version()
    with pytest.raises(errors.InvalidInput, match="holds other columns"):
        archive.run(spark, archive.ArchiveJob(dsn=dsn, path=tmp_path / "new" / "orders", queue="jobs",
                                              checkpoint=tmp_path / "cp-other"))
    assert DeltaTable(str(tmp_path / "new" / "orders")).version() == version


def test_a_small_micro_batch_is_one_file_written_without_starting_spark(dsn, tmp_path):
    """Issue 29, items 13 and 16: 4 rows were 4 files (one per task) after starting a
    JVM. The driver writes a micro-batch of at most rows_per_task rows itself, one file
    per date, and Spark is started only for a larger one."""
    from conveyor.pipeline import session

    sql(dsn, "SELECT conveyor.stream_create('orders')")
    append(dsn, "orders", [f"order {i}" for i in range(4)])
    lazy = session.Lazy("local[2]")
    job = archive.ArchiveJob(dsn=dsn, path=tmp_path / "orders", stream="orders", rows_per_task=10)
    small = archive.run(lazy, job)
    assert (small.rows, small.files, small.spark_batches, lazy.session) == (4, 1, 0, None)
    append(dsn, "orders", [f"more {i}" for i in range(30)])
    assert archive.groups([], 10) == [[]]
    try:
        larger = archive.run(lazy, job)
    finally:
        lazy.stop()
    assert (larger.rows, larger.spark_batches) == (30, 1) and 1 < larger.files <= job.partitions
    assert len(set(_ids(job.path))) == 34


def test_a_checkpoint_of_the_earlier_streaming_query_goes_on_where_it_stopped(dsn, tmp_path):
    """Earlier versions ran a Structured Streaming query: its checkpoint (offsets/<id>,
    commits/<id> in Spark's format) is where the archive goes on from."""
    sql(dsn, "SELECT conveyor.queue_create('jobs')")
    sql(dsn, "SELECT conveyor.message_send_batch('jobs', array(SELECT 'job ' || i FROM generate_series(1, 30) i))")
    sql(dsn, "SELECT conveyor.message_archive('jobs', array(SELECT i::bigint FROM generate_series(1, 10) i))")
    mark = sql(dsn, "SELECT conveyor.pipeline_archive_mark('jobs', true)")[0][0]
    sql(dsn, "SELECT conveyor.message_archive('jobs', array(SELECT i::bigint FROM generate_series(11, 30) i))")
    folder = tmp_path / "jobs" / "_checkpoint"
    (folder / "offsets").mkdir(parents=True)
    (folder / "commits").mkdir()
    conf = '{"batchWatermarkMs":0,"batchTimestampMs":1795833821222,"conf":{"spark.sql.shuffle.partitions":"4"}}'
    (folder / "offsets" / "0").write_text(f'v1\n{conf}\n{{"queue": "jobs", "mark": {mark}}}')
    (folder / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    (folder / "metadata").write_text('{"id":"9af9c4e3-6bb5-498c-9a9b-e14bc2feb978"}')
    done = archive.run(None, archive.ArchiveJob(dsn=dsn, path=tmp_path / "jobs", queue="jobs"))
    assert done.rows == 20 and sorted(_ids(tmp_path / "jobs")) == list(range(11, 31))
    assert (folder / "offsets" / "1").read_text().startswith("v1\n") and (folder / "commits" / "1").exists()


def test_a_continuous_archive_reports_its_rate_and_what_is_waiting(dsn, tmp_path):
    sql(dsn, "SELECT conveyor.stream_create('orders')")
    append(dsn, "orders", [f"order {i}" for i in range(25)])
    tick(dsn, "orders")
    append(dsn, "orders", [f"order {i}" for i in range(25, 50)])
    tick(dsn, "orders")
    lines: list[str] = []
    stop = threading.Event()
    job = archive.ArchiveJob(dsn=dsn, path=tmp_path / "orders", stream="orders", once=False, interval=0.2,
                             max_events=25)

    def progress(line: str) -> None:
        lines.append(line)
        if sum("this run" in x for x in lines) >= 2:
            stop.set()

    done = archive.run(None, job, progress=progress, stop=stop)
    assert done.rows == 50 and done.batches == 2
    # what is waiting is the planner's estimate (from the stream's id sequence, which may skip)
    first = re.fullmatch(r"batch 0: 25 rows in 1 file in [\d.]+ m?s \([\d,.]+ rows/s, the driver\); 25 rows this run; "
                         r"about (\d+) rows waiting", lines[1])
    assert first and 25 <= int(first[1]) <= 35, lines[1]
    assert re.fullmatch(r"batch 1: .*; 50 rows this run; about 0 rows waiting", lines[2]), lines


def test_compact_merges_small_files_and_vacuum_deletes_what_no_version_lists(dsn, tmp_path):
    sql(dsn, "SELECT conveyor.stream_create('orders')")
    job = archive.ArchiveJob(dsn=dsn, path=tmp_path / "orders", stream="orders")
    for n in range(3):
        append(dsn, "orders", [f"order {n}-{i}" for i in range(5)])
        archive.run(None, job)
    stray = tmp_path / "orders" / "date=2000-01-01" / "part-stray.snappy.parquet"
    stray.parent.mkdir()
    stray.write_bytes(b"left by a killed task")
    before = _ids(job.path)
    proc = subprocess.run([sys.executable, "-m", "conveyor", "--json", "pipeline", "compact", "--path", str(job.path),
                           "--retention-hours", "0"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    done = json.loads(proc.stdout)
    assert (done["files_replaced"], done["files_added"]) == (3, 1) and done["files_deleted"] >= 4, done
    assert sorted(_ids(job.path)) == sorted(before) and len(_listed(job.path)) == 1
    assert _on_disk(job.path) == _listed(job.path) and not stray.exists()
    append(dsn, "orders", ["after"])
    assert archive.run(None, job).rows == 1 and len(_ids(job.path)) == 16  # the archive goes on


def test_status_shows_the_archive_consumer_as_the_pipelines(dsn, tmp_path):
    """Issue 29, item 15: the archive's consumer showed growing lag in `status` as if it
    were an application's."""
    from support.cli import ok, ok_json, run

    sql(dsn, "SELECT conveyor.stream_create('orders')")
    sql(dsn, "SELECT conveyor.stream_subscribe('orders', 'billing')")
    append(dsn, "orders", ["a"])
    archive.run(None, archive.ArchiveJob(dsn=dsn, path=tmp_path / "orders", stream="orders"))
    consumers = {c["consumer"]: c["role"] for c in ok_json(run(dsn, "status", "--json"))["consumers"]}
    assert consumers == {"billing": "", "conveyor-archive": "pipeline archive"}
    assert "conveyor-archive (pipeline archive)" in ok(run(dsn, "status"))
