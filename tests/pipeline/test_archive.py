"""``conveyor pipeline archive``: incremental, exactly once across runs and across a
killed driver, as seen by a reader that is not Spark (delta-rs to pyarrow, and pyarrow
reading exactly the Parquet files the Delta log lists)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pyarrow.parquet as pq
from deltalake import DeltaTable

from conveyor.pipeline import archive
from spark.helpers import append, sql, tick


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
