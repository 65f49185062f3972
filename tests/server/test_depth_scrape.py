"""The depth scrape of /metrics takes the queues' figures from the dashboard's latest
sample where the same worker takes the samples (one count of every queue for both), and
counts them itself when that sample is stale or there is none."""

from __future__ import annotations

import datetime as dt

from conveyor.core import history, queues
from conveyor.db import pool
from conveyor.server import workers
from conveyor.server.metrics import Metrics


def _depth(metrics: Metrics, queue: str) -> str:
    return next(line for line in metrics.render().decode().splitlines()
                if line.startswith(f'queue_depth{{queue="{queue}"}}'))


async def test_the_scrape_reads_a_fresh_sample_and_counts_without_one(dsn, conn):
    await queues.create(conn, "jobs")
    await conn.execute("SELECT conveyor.message_send_batch('jobs', array_fill('x'::text, ARRAY[3]))")
    metrics = Metrics()
    database = pool.Database(dsn, min_size=1, max_size=2)
    await database.open(wait=True)
    try:
        await workers.depth_scrape(database, metrics, sampled_within=60)  # no sample yet: counted
        assert _depth(metrics, "jobs") == 'queue_depth{queue="jobs"} 3.0'

        async with database.connection() as c:
            assert await history.record(c, dt.timedelta(hours=1)) > 0
        await conn.execute("SELECT conveyor.message_send_batch('jobs', array_fill('x'::text, ARRAY[2]))")
        await workers.depth_scrape(database, metrics, sampled_within=60)
        # the sample's figure: a count would say 5
        assert _depth(metrics, "jobs") == 'queue_depth{queue="jobs"} 3.0'

        await workers.depth_scrape(database, metrics, sampled_within=0.001)  # a stale sample
        assert _depth(metrics, "jobs") == 'queue_depth{queue="jobs"} 5.0'
        await workers.depth_scrape(database, metrics)  # no history in this worker
        assert _depth(metrics, "jobs") == 'queue_depth{queue="jobs"} 5.0'
    finally:
        await database.close()


async def test_a_dropped_queue_leaves_no_series(dsn, conn):
    """Each scrape replaces the figures whole: a queue dropped since the last one has no
    series left, even when the dashboard's latest sample (from before the drop, the last
    one while no queue is left to sample) is still fresh."""
    await queues.create(conn, "kept")
    await queues.create(conn, "dropped")
    metrics = Metrics()
    database = pool.Database(dsn, min_size=1, max_size=2)
    await database.open(wait=True)
    try:
        async with database.connection() as c:
            assert await history.record(c, dt.timedelta(hours=1)) > 0
        await workers.depth_scrape(database, metrics, sampled_within=60)
        assert 'queue_depth{queue="dropped"}' in metrics.render().decode()
        await queues.drop(conn, "dropped")
        await workers.depth_scrape(database, metrics, sampled_within=60)
        text = metrics.render().decode()
        assert 'queue="dropped"' not in text and 'queue_depth{queue="kept"} 0.0' in text
        await queues.drop(conn, "kept")
        await workers.depth_scrape(database, metrics, sampled_within=60)
        assert 'queue_depth{' not in metrics.render().decode()
    finally:
        await database.close()
