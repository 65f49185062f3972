"""Background workers of a server process: retention clean-up, the depth scrape, message
move tasks (all safe to run in every process at once: the SQL uses SKIP LOCKED), the
stream ticker with stream maintenance, and the VACUUM of hot tables (these two in one
process per database, by advisory lock). Each runs under the supervisor
(server/supervisor.py): an unexpected failure is logged and the worker started again."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Callable

from conveyor import errors, tracing
from conveyor.core import history, move_tasks, partitioned, queues, streams
from conveyor.core import vacuum as vacuums
from conveyor.db import pool
from conveyor.db.execute import Connection
from conveyor.db.pool import Database
from conveyor.server import scheduler, webhooks
from conveyor.server.metrics import Metrics
from conveyor.server.supervisor import Supervisor

log = logging.getLogger(__name__)


# The most of one core's time a job that reads every queue's messages (the depth scrape,
# the dashboard's history) may take: its cost grows with the backlog, so under a big one
# it runs less often than its interval instead of taking the server's CPU.
SCAN_SHARE = 0.1
# How old the dashboard's latest sample may be for the depth scrape to take the queues'
# figures from it instead of counting them again (at least; three history intervals if
# longer): /metrics then shows depths up to that old, against counting every queue twice.
HISTORY_FRESH = 60.0
# The most of one core's time the vacuum of hot tables may take: a hot queue's table takes
# milliseconds, but a big table's pass over its indexes may take seconds.
VACUUM_SHARE = 0.25


def pause(interval: float, took: float, share: float | None = None) -> float:
    """Seconds to wait after a run of a job that took ``took`` seconds: ``interval``, or
    longer if the job would otherwise take more than ``share`` of a core's time."""
    if share is None:
        return interval
    return max(interval, took / share - took)


async def every(interval: float, name: str, job: Callable[[], Awaitable[object]], share: float | None = None) -> None:
    """Run ``job`` now and then every ``interval`` seconds (``pause``: longer for a job
    bounded by ``share``); failures are logged, not fatal."""
    loop = asyncio.get_running_loop()
    while True:
        began = loop.time()
        try:
            with tracing.job_span(name):
                await job()
        except errors.ConveyorError as exc:
            log.warning("%s failed: %s", name, exc)
        except Exception:
            log.exception("%s failed", name)
        await asyncio.sleep(pause(interval, loop.time() - began, share))


async def maintenance(database: Database, max_rounds: int = 10) -> None:
    """Retention clean-up until a round removes nothing (at most ``max_rounds``): queues,
    then partitioned queues (retentionSeconds, completedRetentionSeconds)."""
    for _ in range(max_rounds):
        async with database.connection() as conn:
            removed = await queues.maintenance(conn)
        if not any(removed.values()):
            break
    async with database.connection() as conn:
        await partitioned.maintain(conn)


async def depth_scrape(database: Database, metrics: Metrics, sampled_within: float | None = None) -> None:
    """Queue depths, streams with their consumers, and consumer groups' lag, for /metrics.
    ``sampled_within``: the queues' figures are those of the dashboard's latest sample if
    it is younger than that many seconds (the worker takes the samples too): counting every
    queue reads all its messages, and one count then serves both."""
    async with database.connection() as conn:
        sampled = (await history.latest_queues(conn, dt.timedelta(seconds=sampled_within))
                   if sampled_within is not None else [])
        metrics.set_depths(sampled or await queues.metrics_all(conn))
        metrics.set_streams(await streams.stats(conn), await streams.consumer_stats(conn),
                            await partitioned.group_lag(conn))


async def record_history(database: Database, interval: float, retention: float) -> None:
    """One sample for the dashboard's charts, pruned to ``retention`` seconds. The first
    worker of every server runs this; the SQL takes one sample per period (the first
    server to come, where several share the database)."""
    async with database.connection() as conn:
        await history.record(conn, dt.timedelta(seconds=retention), dt.timedelta(seconds=interval * 0.8))


async def move_dead_letters(database: Database) -> None:
    async with database.connection() as conn:
        await move_tasks.step(conn)


async def as_leader(dsn: str, what: str, take_lock: Callable[[Connection], Awaitable[bool]],
                    job: Callable[[Connection], Awaitable[None]], retry_interval: float = 5.0) -> None:
    """Run ``job`` (which runs for good) in one process per database: the one holding a
    session advisory lock (``take_lock``) on its own connection; the others retry now and
    then, so another takes over when the holder stops or loses its connection."""
    while True:
        try:
            async with pool.connect(dsn) as conn:
                while not await take_lock(conn):  # noqa: ASYNC110 - the lock is in PostgreSQL
                    await asyncio.sleep(retry_interval)
                log.info("this process runs %s", what)
                await job(conn)
        except errors.ConveyorError as exc:
            log.warning("%s: %s; retrying", what, exc)
        await asyncio.sleep(retry_interval)


async def stream_ticker(dsn: str, *, tick_interval: float, maint_interval: float, retry_interval: float = 5.0) -> None:
    """The streams' ticker and maintenance, in one process per database (``as_leader``)."""
    await as_leader(dsn, "the stream ticker", streams.take_ticker_lock,
                    lambda conn: _tick_forever(conn, tick_interval, maint_interval), retry_interval)


async def _tick_forever(conn: Connection, tick_interval: float, maint_interval: float) -> None:
    loop = asyncio.get_running_loop()
    next_maint = loop.time()
    while True:
        await streams.ticker(conn)
        now = loop.time()
        if now >= next_maint:
            for _ in range(2):  # the second round completes a rotation the first began
                await streams.maint(conn)
            next_maint = now + maint_interval
        await asyncio.sleep(tick_interval)


async def vacuum(dsn: str, *, interval: float, retry_interval: float = 5.0) -> None:
    """VACUUM Conveyor's tables whose dead row versions passed conveyor.tables_to_vacuum()'s
    bar, looked at every ``interval`` seconds (longer after long vacuums: ``VACUUM_SHARE``),
    in one process per database (``as_leader``)."""
    async def vacuum_forever(conn: Connection) -> None:
        loop = asyncio.get_running_loop()
        vacuumer = vacuums.Vacuumer()
        while True:
            began = loop.time()
            await vacuumer.run(conn)
            await asyncio.sleep(pause(interval, loop.time() - began, VACUUM_SHARE))

    await as_leader(dsn, "the vacuum of hot tables", vacuums.take_lock, vacuum_forever, retry_interval)


def start(supervisor: Supervisor, database: Database, metrics: Metrics, *, maintenance_interval: float,
          depth_interval: float, first: bool = True, move_interval: float = 1.0,
          stream_intervals: tuple[float, float] = (0.5, 30.0), vacuum_interval: float = 1.0,
          webhook_config: webhooks.Config | None = None,
          scheduler_config: scheduler.Config | None = None,
          history_config: tuple[float, float] | None = None) -> None:
    """Start every background worker under ``supervisor`` (which restarts a failed one).
    The jobs that read every queue's messages, the depth scrape and the dashboard's
    history, run in the ``first`` worker process of a server only: their figures are the
    database's, and /metrics shows them from any worker (gauges of mode livemax)."""
    tick, maint = stream_intervals
    supervisor.start("stream-ticker", lambda: stream_ticker(database.dsn, tick_interval=tick, maint_interval=maint))
    if vacuum_interval > 0:
        supervisor.start("vacuum", lambda: vacuum(database.dsn, interval=vacuum_interval))
    supervisor.start("move-tasks", lambda: every(move_interval, "message move tasks",
                                                 lambda: move_dead_letters(database)))
    supervisor.start("maintenance", lambda: every(maintenance_interval, "maintenance", lambda: maintenance(database)))
    # with the history here, the scrape takes the queues' figures from its latest sample:
    # one that the pacing (below) spaced out under a large backlog is still recent enough
    sampled_within = None if history_config is None else max(HISTORY_FRESH, 3 * history_config[0])
    if first:
        supervisor.start("depth-scrape", lambda: every(depth_interval, "depth scrape",
                                                       lambda: depth_scrape(database, metrics, sampled_within),
                                                       SCAN_SHARE))
    if first and history_config is not None:  # the dashboard's charts: (interval, retention) in seconds
        interval, retention = history_config
        supervisor.start("history", lambda: every(interval, "history", lambda: record_history(database, interval,
                                                                                             retention), SCAN_SHARE))
    if webhook_config is not None:  # the topics' HTTP(S) deliveries (SKIP LOCKED: every process may run it)
        supervisor.start("webhooks", lambda: webhooks.run(database, metrics, webhook_config))
    if scheduler_config is not None:  # schedules (SKIP LOCKED: every process runs it)
        supervisor.start("scheduler", lambda: scheduler.run(database, metrics, scheduler_config))
