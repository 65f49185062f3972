"""``conveyor pipeline report`` end to end: archive a queue, its dead-letter queue and a
stream, run the command (its own process and Spark session), and check the JSON figures
against what was sent, and that the HTML embeds its PNG charts."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from conveyor.pipeline import archive
from spark.helpers import append, sql, tick

pytestmark = pytest.mark.long(40)  # seconds on a quiet machine: started first (tests/support/parallel.py)


def _percentile(values: list[float], q: float) -> float:
    """Spark's exact percentile: linear interpolation between closest ranks."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def test_report_figures_match_what_was_sent(spark, dsn, tmp_path):
    sql(dsn, "SELECT conveyor.queue_create('dlq')")
    sql(dsn, """SELECT conveyor.queue_create('jobs', '{"max_receive_count": 2, "dead_letter_queue": "dlq"}')""")
    sql(dsn, "SELECT conveyor.message_send_batch('jobs', array(SELECT 'job ' || i FROM generate_series(1, 100) i))")
    # 1-10 received twice (retried once), 11-15 three times (the third receive dead-letters them)
    sql(dsn, "SELECT conveyor.message_set_vt('jobs', array(SELECT i::bigint FROM generate_series(16, 100) i), 600)")
    for _ in range(2):
        sql(dsn, "SELECT * FROM conveyor.message_receive('jobs', 0, 15)")
    sql(dsn, "SELECT conveyor.message_set_vt('jobs', array(SELECT i::bigint FROM generate_series(1, 10) i), 600)")
    sql(dsn, "SELECT * FROM conveyor.message_receive('jobs', 0, 15)")
    sql(dsn, "SELECT conveyor.message_archive('jobs', array(SELECT i::bigint FROM generate_series(1, 100) i))")
    sql(dsn, "SELECT conveyor.message_archive('dlq', array(SELECT id FROM conveyor.message_peek('dlq', 100)))")
    latencies = [float(r[0]) for r in sql(dsn, """
        SELECT extract(epoch FROM a.archived_at - a.sent_at) * 1000 FROM conveyor.archive a
          JOIN conveyor.queues q ON q.id = a.queue_id WHERE q.name = 'jobs'""")]
    deliveries = [float(r[0]) for r in sql(dsn, """
        SELECT extract(epoch FROM a.first_received_at - a.sent_at) * 1000 FROM conveyor.archive a
          JOIN conveyor.queues q ON q.id = a.queue_id WHERE q.name = 'jobs' AND a.first_received_at IS NOT NULL""")]

    sql(dsn, "SELECT conveyor.stream_create('clicks')")
    sql(dsn, "SELECT conveyor.stream_subscribe('clicks', 'worker')")
    events = append(dsn, "clicks", [f"c{i}" for i in range(40)])
    tick(dsn, "clicks")
    batch = sql(dsn, "SELECT conveyor.stream_next_batch('clicks', 'worker')")[0][0]
    for event in events[:4]:
        sql(dsn, "SELECT conveyor.stream_dead_letter(%s, %s, 'bad')", batch, event)

    lake = tmp_path / "lake"
    for name, kwargs in (("jobs", {"queue": "jobs"}), ("dlq", {"queue": "dlq"}),
                         ("clicks", {"stream": "clicks", "starting_position": "earliest",
                                     "consumer": "archiver"})):
        archive.run(spark, archive.ArchiveJob(dsn=dsn, path=lake / name, **kwargs))

    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "conveyor", "--database-url", dsn, "pipeline", "report", str(lake),
         "--out", str(out), "--master", "local[2]", "--conf", "spark.sql.shuffle.partitions=2", "--json"],
        env=os.environ.copy(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "computing queue figures" in proc.stderr  # progress
    figures = json.loads((out / "report.json").read_text())
    assert json.loads(proc.stdout)["sources"] == figures["sources"]
    by_name = {(s["kind"], s["name"]): s for s in figures["sources"]}

    jobs = by_name[("queue", "jobs")]
    assert jobs["messages"] == 95  # 5 went to the dead-letter queue
    assert (jobs["retried"], jobs["retries"]) == (10, 10)
    assert (jobs["dead_lettered"], jobs["dead_letter_rate"]) == (5, 0.05)
    for key, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        assert abs(jobs["latency_ms"][key] - _percentile(latencies, q)) < 0.01
        # enqueue to first delivery, of the messages that were delivered
        assert abs(jobs["first_delivery_ms"][key] - _percentile(deliveries, q)) < 0.01
    assert "acknowledgement" in jobs["latency_measures"]
    assert sum(m["count"] for m in jobs["throughput_per_minute"]) == 95
    assert by_name[("queue", "dlq")]["messages"] == 5

    clicks = by_name[("stream", "clicks")]
    assert clicks["messages"] == 40
    assert (clicks["dead_lettered"], clicks["dead_letter_rate"]) == (4, 0.1)
    assert clicks["latency_ms"]["p50"] >= 0 and statistics.fmean(m["count"] for m in clicks["throughput_per_minute"]) > 0
    assert "when the archive job ran" in clicks["latency_measures"] and clicks["notes"] == []

    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "jobs" in page and "clicks" in page
    for chart in ("throughput.png", "latency.png"):
        assert (out / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
