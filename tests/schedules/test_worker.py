"""The scheduler worker (conveyor.server.scheduler): passes over a connection pool with an
injected clock, backlog draining, metrics, the loop surviving a failure, configuration
from settings; and two real ``conveyor serve`` processes sharing the schedules without
ever firing one twice."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import httpx
import pytest

from conveyor import types
from conveyor.core import messages, queues, schedule_expr, schedules
from conveyor.db import pool
from conveyor.db.pool import Database
from conveyor.server import scheduler
from conveyor.server.metrics import Metrics
from conveyor.settings import Settings
from support.server import ServerProcess

UTC = dt.UTC
T0 = dt.datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def spec(**kwargs: object) -> types.ScheduleSpec:
    shape = {k: kwargs.pop(k) for k in ("every", "fire_at") if k in kwargs}
    return types.ScheduleSpec(expression=schedule_expr.parse(**(shape or {"every": "5m"})), target="jobs",
                              **kwargs)


@pytest.fixture
async def database(dsn):
    db = Database(dsn, min_size=1, max_size=4)
    await db.open(wait=True)
    yield db
    await db.close()


async def test_step_drains_a_backlog_in_full_batches_and_counts(database):
    async with database.connection() as conn:
        await queues.create(conn, "jobs")
        for i in range(7):
            await schedules.create(conn, f"s{i}", spec(), now=T0)
        await schedules.create(conn, "bad", spec(failure_threshold=1), now=T0)
        await conn.execute("UPDATE conveyor.schedules SET target = 'missing' WHERE name = 'bad'")
    metrics = Metrics()
    config = scheduler.Config(batch_size=3, clock=lambda: T0 + dt.timedelta(minutes=5, seconds=1))
    done = await scheduler.step(database, metrics, config)
    assert sorted(f.name for f in done) == ["bad", *(f"s{i}" for i in range(7))]  # three passes: 3 + 3 + 2
    assert metrics.schedule_fires._value.get() == 7
    assert metrics.schedule_failures._value.get() == 1 and metrics.schedule_pauses._value.get() == 1
    assert await scheduler.step(database, metrics, config) == []  # nothing due any more at that time
    async with database.connection() as conn:
        assert len(await messages.peek(conn, "jobs", 100)) == 7


async def test_step_respects_max_rounds(database):
    async with database.connection() as conn:
        await queues.create(conn, "jobs")
        for i in range(5):
            await schedules.create(conn, f"s{i}", spec(), now=T0)
    config = scheduler.Config(batch_size=2, max_rounds=2, clock=lambda: T0 + dt.timedelta(minutes=5))
    assert len(await scheduler.step(database, Metrics(), config)) == 4
    assert len(await scheduler.step(database, Metrics(), config)) == 1


async def test_run_loops_until_cancelled_and_survives_failures(database):
    async with database.connection() as conn:
        await queues.create(conn, "jobs")
        await schedules.create(conn, "s", spec(), now=T0)
    ticks = iter([T0 + dt.timedelta(minutes=m) for m in (5, 10, 15, 20, 25, 30, 35, 40)])
    calls = 0

    def clock() -> dt.datetime:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("a broken clock, once")  # the loop logs it and goes on
        return next(ticks, T0 + dt.timedelta(minutes=40))

    task = asyncio.create_task(scheduler.run(database, Metrics(), scheduler.Config(poll_seconds=0.01, clock=clock)))
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            async with database.connection() as conn:
                if len(await messages.peek(conn, "jobs", 100)) >= 3:
                    break
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    async with database.connection() as conn:
        got = [m.headers["_schedule"]["scheduled_for"] for m in await messages.peek(conn, "jobs", 100)]
    # the failed pass took no time from the clock: the next pass goes on at 12:10
    assert got[:3] == ["2026-01-05T12:05:00Z", "2026-01-05T12:10:00Z", "2026-01-05T12:15:00Z"]


def test_config_from_settings():
    urls = types.TopicUrls(region="eu-west-1", account_id="000000000000", base_url="http://127.0.0.1:9999")
    assert scheduler.config_from(Settings(schedule_enabled=False), urls) is None
    config = scheduler.config_from(Settings(schedule_poll_seconds=0.5, schedule_batch_size=8), urls)
    assert (config.poll_seconds, config.batch_size, config.urls) == (0.5, 8, urls)
    env = Settings.from_env({"CONVEYOR_SCHEDULE_ENABLED": "false", "CONVEYOR_SCHEDULE_POLL_SECONDS": "2.5",
                             "CONVEYOR_SCHEDULE_BATCH_SIZE": "64"})
    assert (env.schedule_enabled, env.schedule_poll_seconds, env.schedule_batch_size) == (False, 2.5, 64)
    with pytest.raises(ValueError, match="schedule poll"):
        Settings(schedule_batch_size=0)


def test_two_server_processes_never_fire_a_schedule_twice(dsn):
    """Two servers poll every 0.1 s over the same 40 one-shots, due together: each fires
    exactly once, and every one of them is deleted."""
    env = {"CONVEYOR_SCHEDULE_POLL_SECONDS": "0.1", "CONVEYOR_SCHEDULE_BATCH_SIZE": "4"}
    servers = [ServerProcess(dsn, env=env), ServerProcess(dsn, env=env)]
    try:
        for s in servers:
            s.start()

        async def setup() -> None:
            async with pool.connect(dsn) as conn:
                await queues.create(conn, "jobs")
                fire_at = dt.datetime.now(UTC) + dt.timedelta(seconds=1)
                async with conn.transaction():  # all become due at once
                    for i in range(40):
                        await schedules.create(conn, f"one-{i:02d}", spec(fire_at=fire_at.isoformat()))

        async def fired() -> tuple[list[str], int]:
            async with pool.connect(dsn) as conn:
                got = [m.headers["_schedule"]["name"] for m in await messages.peek(conn, "jobs", 1000)]
                return got, len(await schedules.list_all(conn))

        asyncio.run(setup())
        deadline = time.monotonic() + 20
        got, left = asyncio.run(fired())
        while (len(got) < 40 or left) and time.monotonic() < deadline:
            time.sleep(0.2)
            got, left = asyncio.run(fired())
        time.sleep(0.5)  # a double fire would show up now
        got, left = asyncio.run(fired())
        assert sorted(got) == [f"one-{i:02d}" for i in range(40)] and left == 0
        totals = []
        for s in servers:
            text = httpx.get(s.url + "/metrics").text
            totals.append(sum(float(line.split()[-1]) for line in text.splitlines()
                              if line.startswith("schedule_fires_total")))
        assert sum(totals) == 40
    finally:
        for s in servers:
            s.kill()
