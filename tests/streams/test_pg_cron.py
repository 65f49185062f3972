"""Server-less streams: the real pg_cron runs Conveyor's ticker and maintenance.

No mocks: pg_cron (Debian's ``postgresql-15-cron``, installed by ``.ci/run``) is
preloaded into throwaway embedded clusters, never into the machine's PostgreSQL.
pg_cron runs a job in one of two ways, fixed when the server starts, and both are
tested, side by side, so that the one wait for a minute boundary serves both:

* ``libpq`` (pg_cron's default): the scheduler logs in to ``cron.host`` as the job's
  user like any client. The embedded cluster asks every client for a password, so
  here a private pg_hba.conf trusts the unix socket, whose directory only the server's
  own user can enter, and ``cron.host`` points at that directory.
* ``bgworker`` (``cron.use_background_workers = on``): the job runs in a background
  worker, no login at all.

A third cluster, ``noauth``, only preloads pg_cron, as someone might who simply turns
it on for the embedded cluster: pg_cron's default mode then cannot log in (every client
needs a password), which the tests pin down, together with what ``conveyor.status()``
makes of those failed runs.

pg_cron 1.4 cannot schedule more often than once a minute, so ``conveyor.start()``
schedules a minute job that loops ``conveyor.ticker()`` every second for 55 s,
committing each tick; the tests check that those ticks really are committed one by
one while the job is still running.

Each cluster lives in its own directory directly under /tmp (see
tests/db/test_embedded.py for why not tmp_path) and is stopped and removed at the end.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import conninfo

from conveyor.db import migrate, pool
from conveyor.db.embedded import DATABASE, EmbeddedError, EmbeddedPostgres, find_binaries

pytestmark = [pytest.mark.slow, pytest.mark.long(70)]

MODES = ("libpq", "bgworker")  # configurations in which pg_cron's jobs can run
NOAUTH = "noauth"  # pg_cron's defaults: its logins are refused
TICKER_COMMAND = "CALL conveyor.ticker_loop(55, 1000)"
MAINT_COMMAND = "CALL conveyor.maint_run()"
VACUUM_COMMAND = (
    "VACUUM conveyor.streams, conveyor.stream_ticks, conveyor.stream_consumers, "
    "conveyor.stream_retries, conveyor.stream_delayed"
)
JOBS = {  # component in conveyor.status() -> (cron.job jobname, schedule, command)
    "ticker": ("conveyor_ticker", "* * * * *", TICKER_COMMAND),
    "maint": ("conveyor_maint", "* * * * *", MAINT_COMMAND),
    "vacuum": ("conveyor_vacuum", "*/5 * * * *", VACUUM_COMMAND),
}
DELIVERY_TIMEOUT = 80.0  # the minute job starts at the next minute boundary
TICK_WINDOW = 10.0  # seconds during which ticks are counted
SEND_EVERY = 0.25  # seconds between events sent during the window


# --------------------------------------------------------------------------- helpers


def q(dsn: str, sql: str, params: tuple[Any, ...] | None = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def status(dsn: str) -> dict[str, tuple[str, str]]:
    return {component: (state, detail) for component, state, detail in q(dsn, "SELECT * FROM conveyor.status()")}


def migrate_db(dsn: str) -> None:
    async def apply() -> None:
        async with pool.connect(dsn) as conn:
            await migrate.migrate(conn)

    asyncio.run(apply())


def pg_cron_library() -> Path | None:
    """pg_cron.so beside the server binaries the embedded cluster would use (Debian layout)."""
    try:
        bin_dir = find_binaries()
    except EmbeddedError:
        return None
    library = bin_dir.parent / "lib" / "pg_cron.so"
    return library if library.exists() else None


@dataclass
class Cluster:
    mode: str
    base: Path
    pg: EmbeddedPostgres
    dsn: str = ""

    def log_tail(self, size: int = 4000) -> str:
        try:
            return self.pg.log_file.read_text(errors="replace")[-size:]
        except OSError as exc:
            return f"(no server log: {exc})"


def start_cluster(mode: str) -> Cluster:
    base = Path(tempfile.mkdtemp(prefix=f"conveyor-cron-{mode}-", dir="/tmp"))
    os.chmod(base, 0o755)  # the server may run as another user: it must traverse this
    data_dir = base / "data"
    settings: dict[str, str | int | bool] = {"shared_preload_libraries": "pg_cron", "cron.database_name": DATABASE}
    if mode == "bgworker":
        settings["cron.use_background_workers"] = True
    elif mode == "libpq":
        hba = base / "pg_hba.conf"
        hba.write_text(
            "# unix socket: its directory is private to the server's user (pg_cron logs in here)\n"
            "local all all trust\n"
            "host all all 127.0.0.1/32 scram-sha-256\n"
        )
        hba.chmod(0o644)
        settings["hba_file"] = str(hba)
        settings["cron.host"] = str(data_dir / "sock")
    cluster = Cluster(mode, base, EmbeddedPostgres(data_dir, settings=settings))
    try:
        cluster.dsn = cluster.pg.start()
        migrate_db(cluster.dsn)
        q(cluster.dsn, "CREATE EXTENSION pg_cron")
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def stop_cluster(cluster: Cluster) -> None:
    try:
        cluster.pg.stop()  # fast shutdown: also ends a ticker loop in progress
    except EmbeddedError:
        pass
    finally:
        if cluster.pg.is_running():
            cluster.pg._pg_ctl("stop", "-w", "-m", "immediate", check=False, timeout=60)
        shutil.rmtree(cluster.base, ignore_errors=True)


@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[str, Cluster]]:
    if pg_cron_library() is None:
        reason = "pg_cron is not installed for the PostgreSQL server (apt-get install postgresql-15-cron; .ci/run does)"
        if os.environ.get("CONVEYOR_REQUIRE_PG_CRON"):  # set by .ci/run: CI must not skip these
            pytest.fail(reason)
        pytest.skip(reason)
    started: dict[str, Cluster] = {}
    try:
        for mode in (*MODES, NOAUTH):
            started[mode] = start_cluster(mode)
        yield started
    finally:
        for cluster in started.values():
            stop_cluster(cluster)


# ------------------------------------------------------------ scheduling, no waiting


def test_custom_settings_reach_the_server(clusters):
    for mode, cluster in clusters.items():
        settings = dict(q(cluster.dsn, "SELECT name, setting FROM pg_settings WHERE name LIKE 'cron.%'"))
        assert q(cluster.dsn, "SHOW shared_preload_libraries") == [("pg_cron",)]
        assert settings["cron.database_name"] == DATABASE
        assert settings["cron.use_background_workers"] == ("on" if mode == "bgworker" else "off")
        if mode == "libpq":
            assert settings["cron.host"] == str(cluster.pg.socket_dir)
            assert q(cluster.dsn, "SHOW hba_file") == [(str(cluster.base / "pg_hba.conf"),)]


def test_without_the_extension_start_and_status_say_so(clusters):
    cluster = clusters["libpq"]
    q(cluster.dsn, "CREATE DATABASE nocron")
    try:
        dsn = conninfo.make_conninfo(cluster.dsn, dbname="nocron")
        migrate_db(dsn)

        [(message,)] = q(dsn, "SELECT conveyor.start()")
        assert message.startswith("pg_cron is not installed in this database")
        assert "conveyor.ticker()" in message and "conveyor.maint_run()" in message
        assert status(dsn) == {
            "pg_cron": (
                "absent",
                "pg_cron is not installed; the ticker and maintenance must run elsewhere (conveyor serve does)",
            )
        }
        assert q(dsn, "SELECT conveyor.stop()") == [("pg_cron is not installed: nothing to stop",)]
        assert q(dsn, "SELECT * FROM conveyor.stream_cron") == [(True, None, None, None)]
    finally:
        q(cluster.dsn, "DROP DATABASE nocron WITH (FORCE)")


def conveyor_jobs(dsn: str) -> dict[str, tuple[Any, ...]]:
    rows = q(
        dsn,
        "SELECT jobname, jobid, schedule, command, database, username, active FROM cron.job"
        " WHERE jobname LIKE 'conveyor%' ORDER BY jobid",
    )
    return {row[0]: row[1:] for row in rows}


def assert_scheduled(dsn: str, message: str) -> tuple[int, int, int]:
    jobs = conveyor_jobs(dsn)
    assert set(jobs) == {name for name, _, _ in JOBS.values()}
    assert len(q(dsn, "SELECT 1 FROM cron.job")) == 3  # nothing else either
    for name, schedule, command in JOBS.values():
        _, job_schedule, job_command, database, username, active = jobs[name]
        assert (job_schedule, job_command, database, username, active) == (schedule, command, DATABASE, "conveyor", True)
    ids = tuple(jobs[name][0] for name, _, _ in JOBS.values())
    assert q(dsn, "SELECT ticker_job_id, maint_job_id, vacuum_job_id FROM conveyor.stream_cron") == [ids]
    assert message.startswith(f"scheduled pg_cron jobs {ids[0]}, {ids[1]}, {ids[2]} ")

    report = status(dsn)
    assert report["pg_cron"][0] == "installed"
    assert report["pg_cron"][1] == "version " + q(dsn, "SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'")[0][0]
    for (component, (_, schedule, _)), job_id in zip(JOBS.items(), ids, strict=False):
        state, detail = report[component]
        assert state == "scheduled"
        assert detail.startswith(f"job {job_id} {schedule}, ")
    return ids  # type: ignore[return-value]


def test_start_schedules_three_jobs_once_and_stop_removes_them(clusters):
    dsn = clusters["libpq"].dsn
    was_started = q(dsn, "SELECT ticker_job_id IS NOT NULL FROM conveyor.stream_cron") == [(True,)]

    [(message,)] = q(dsn, "SELECT conveyor.start()")
    first = assert_scheduled(dsn, message)

    [(message,)] = q(dsn, "SELECT conveyor.start()")  # again: replaces, never adds
    second = assert_scheduled(dsn, message)
    assert not set(first) & set(second)

    # A job removed behind Conveyor's back shows as missing, and stop() copes with it.
    q(dsn, "SELECT cron.unschedule(%s)", (second[0],))
    assert status(dsn)["ticker"] == ("missing", f"job {second[0]} no longer exists in cron.job")

    assert q(dsn, "SELECT conveyor.stop()") == [("stopped",)]
    assert conveyor_jobs(dsn) == {}
    assert q(dsn, "SELECT * FROM conveyor.stream_cron") == [(True, None, None, None)]
    report = status(dsn)
    for component in JOBS:
        assert report[component] == ("stopped", "not scheduled (SELECT conveyor.start())")
    assert q(dsn, "SELECT conveyor.stop()") == [("stopped",)]  # idempotent

    if was_started:  # leave things as the module's other tests had them
        q(dsn, "SELECT conveyor.start()")


# ------------------------------------------------------------------- the real thing


@dataclass
class LiveRun:
    """What one cluster did once pg_cron's jobs ran (collected by the ``live`` fixture)."""

    cluster: Cluster
    job_ids: tuple[int, int, int] = (0, 0, 0)
    pg_cron_version: str = ""
    sent_at: datetime | None = None
    delivered_at: datetime | None = None
    delivered: list[tuple[Any, ...]] = field(default_factory=list)
    window: tuple[datetime, datetime] | None = None
    window_ticks: list[datetime] = field(default_factory=list)
    window_sent: int = 0
    window_received: int = 0
    ticker_run_during_window: list[tuple[Any, ...]] = field(default_factory=list)
    ticker_backend: tuple[Any, ...] | None = None  # (query_start, xact_start, backend_type) mid-window
    maint_runs: list[tuple[Any, ...]] = field(default_factory=list)
    rotation: tuple[Any, ...] | None = None
    status: dict[str, tuple[str, str]] = field(default_factory=dict)

    def diagnostics(self) -> str:
        runs = q(
            self.cluster.dsn,
            "SELECT jobid, runid, status, return_message, start_time, end_time FROM cron.job_run_details ORDER BY runid",
        )
        lines = [f"[{self.cluster.mode}] cron.job_run_details:"] + [f"  {run}" for run in runs]
        return "\n".join(lines) + f"\nserver log:\n{self.cluster.log_tail()}"


def receive_all(dsn: str) -> list[tuple[Any, ...]]:
    """Everything the consumer can get now, acknowledged."""
    got: list[tuple[Any, ...]] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            rows = conn.execute("SELECT * FROM conveyor.stream_receive('s', 'c')").fetchall()
            if not rows:
                return got
            got += rows
            conn.execute("SELECT conveyor.stream_ack(%s)", (rows[0][1],))


@pytest.fixture(scope="module")
def live(clusters: dict[str, Cluster]) -> dict[str, LiveRun]:
    """Schedule the jobs in every cluster, send an event, and watch pg_cron deliver it."""
    runs = {mode: LiveRun(clusters[mode]) for mode in MODES}
    noauth = LiveRun(clusters[NOAUTH])
    # Jobs scheduled in the last instant of a minute might first run a minute later.
    second = float(q(noauth.cluster.dsn, "SELECT extract(second FROM clock_timestamp())")[0][0])
    if second > 57:
        time.sleep(61 - second)
    for run in [*runs.values(), noauth]:
        dsn = run.cluster.dsn
        q(dsn, """SELECT * FROM conveyor.stream_create('s', '{"ticker_max_lag": "0 seconds"}')""")
        q(dsn, "SELECT conveyor.stream_subscribe('s', 'c')")
        # A stream for maint to rotate: with no consumer and a 1 s period, one maint_run()
        # switches tables (step 1), commits, and records step 2.
        q(dsn, """SELECT * FROM conveyor.stream_create('rot', '{"rotation_period": "1 second"}')""")
        q(dsn, "UPDATE conveyor.streams SET switch_time = now() - interval '1 minute' WHERE name = 'rot'")
        q(dsn, "SELECT conveyor.start()")
        run.job_ids = q(dsn, "SELECT ticker_job_id, maint_job_id, vacuum_job_id FROM conveyor.stream_cron")[0]
        run.pg_cron_version = q(dsn, "SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'")[0][0]
        run.sent_at = q(dsn, "SELECT clock_timestamp()")[0][0]
        q(dsn, "SELECT conveyor.stream_send('s', 'hello')")

    # 1. The event arrives once the ticker job has started (at the next minute boundary).
    deadline = time.monotonic() + DELIVERY_TIMEOUT
    waiting = set(runs)
    while waiting and time.monotonic() < deadline:
        for mode in sorted(waiting):
            run = runs[mode]
            got = receive_all(run.cluster.dsn)
            if got:
                run.delivered, run.delivered_at = got, q(run.cluster.dsn, "SELECT clock_timestamp()")[0][0]
                waiting.discard(mode)
        time.sleep(0.25)
    delivered = [run for run in runs.values() if run.delivered_at is not None]
    runs[NOAUTH] = noauth
    if not delivered:
        return runs

    # 2. While the minute job runs: events keep flowing, ticks are counted, and the job's
    #    backend is sampled (a transaction younger than its statement means it committed).
    conns = {mode: psycopg.connect(run.cluster.dsn, autocommit=True) for mode, run in runs.items() if run.delivered_at}
    try:
        starts = {mode: conn.execute("SELECT clock_timestamp()").fetchone()[0] for mode, conn in conns.items()}
        end = time.monotonic() + TICK_WINDOW
        sampled = False
        while time.monotonic() < end:
            for conn in conns.values():
                conn.execute("SELECT conveyor.stream_send('s', 'tick tock')")
            for mode in conns:
                runs[mode].window_sent += 1
            if not sampled and end - time.monotonic() < TICK_WINDOW / 2:
                sampled = True
                for mode, conn in conns.items():
                    run = runs[mode]
                    run.ticker_backend = conn.execute(
                        "SELECT query_start, xact_start, backend_type FROM pg_stat_activity WHERE query = %s",
                        (TICKER_COMMAND,),
                    ).fetchone()
                    run.ticker_run_during_window = conn.execute(
                        "SELECT status, start_time FROM cron.job_run_details WHERE jobid = %s ORDER BY runid",
                        (run.job_ids[0],),
                    ).fetchall()
            time.sleep(SEND_EVERY)
        for mode, conn in conns.items():
            run = runs[mode]
            run.window = (starts[mode], starts[mode] + timedelta(seconds=TICK_WINDOW))
            run.window_ticks = [
                row[0]
                for row in conn.execute(
                    "SELECT t.tick_time FROM conveyor.stream_ticks t JOIN conveyor.streams s ON s.id = t.stream_id"
                    " WHERE s.name = 's' AND t.tick_time >= %s AND t.tick_time < %s ORDER BY t.tick_id",
                    run.window,
                ).fetchall()
            ]
    finally:
        for conn in conns.values():
            conn.close()

    # 3. Every event sent in the window arrives within a couple of ticks.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(r.window_received < r.window_sent for r in delivered):
        for run in delivered:
            run.window_received += len(receive_all(run.cluster.dsn))
        time.sleep(0.25)

    # 4. The maintenance job of this minute (bounded wait for its run to be recorded).
    deadline = time.monotonic() + 5
    for run in [*delivered, noauth]:
        while True:
            run.maint_runs = q(
                run.cluster.dsn,
                "SELECT status, return_message, start_time, end_time FROM cron.job_run_details"
                " WHERE jobid = %s ORDER BY runid",
                (run.job_ids[1],),
            )
            if any(r[0] in ("succeeded", "failed") for r in run.maint_runs) or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        run.rotation = q(
            run.cluster.dsn, "SELECT cur_table, switch_step2 IS NOT NULL FROM conveyor.streams WHERE name = 'rot'"
        )[0]
        run.status = status(run.cluster.dsn)
    noauth.delivered = receive_all(noauth.cluster.dsn)
    return runs


@pytest.mark.parametrize("mode", MODES)
def test_pg_cron_ticker_delivers_an_event(live, mode):
    run = live[mode]
    assert run.delivered_at is not None, (
        f"pg_cron's ticker did not deliver the event within {DELIVERY_TIMEOUT:.0f} s\n" + run.diagnostics()
    )
    assert [(event[2], event[3]) for event in run.delivered] == [("default", "hello")]
    assert run.delivered_at - run.sent_at < timedelta(seconds=DELIVERY_TIMEOUT)


@pytest.mark.parametrize("mode", MODES)
def test_minute_job_ticks_every_second(live, mode):
    run = live[mode]
    assert run.window is not None, "no delivery, so no tick window\n" + run.diagnostics()
    ticks = run.window_ticks
    assert len(ticks) >= 5, f"{len(ticks)} ticks in {TICK_WINDOW:.0f} s: {ticks}\n" + run.diagnostics()
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(ticks)]
    assert all(0.5 < gap < 2.5 for gap in gaps), gaps  # every_ms = 1000, not a busy loop
    assert run.window_sent > 20
    assert run.window_received == run.window_sent


@pytest.mark.parametrize("mode", MODES)
def test_ticker_loop_commits_every_tick_under_pg_cron(live, mode):
    """The procedure is still running while its ticks are already visible elsewhere."""
    run = live[mode]
    assert run.window is not None, "no delivery, so no tick window\n" + run.diagnostics()
    assert run.ticker_run_during_window, "the ticker job has no run\n" + run.diagnostics()
    state, started = run.ticker_run_during_window[-1]
    assert state == "running"
    assert started <= run.window[0]
    assert run.ticker_backend is not None, "no backend was running the ticker job\n" + run.diagnostics()
    query_start, xact_start, backend_type = run.ticker_backend
    assert backend_type == ("pg_cron" if mode == "bgworker" else "client backend")
    # The CALL began at the minute boundary; its current transaction began seconds later.
    assert xact_start - query_start > timedelta(seconds=1)
    assert run.status["ticker"][0] == "scheduled"
    assert f"last run running at {started:%Y-%m-%d %H:%M:%S}" in run.status["ticker"][1]


@pytest.mark.parametrize("mode", MODES)
def test_maint_job_runs_and_status_reports_it(live, mode):
    run = live[mode]
    assert run.window is not None, "no delivery, so the jobs never ran\n" + run.diagnostics()
    assert run.maint_runs, "the maintenance job has no run\n" + run.diagnostics()
    state, message, started, _ = run.maint_runs[-1]
    # With background workers, pg_cron 1.4's scheduler waits for the running ticker job
    # before it records the end of jobs it polls after it (pg_cron issue #200, fixed in
    # 1.5), so a finished maint run could read 'running' until the loop ends.
    assert (state, message) == ("succeeded", "CALL"), run.diagnostics()
    # maint_run() rotated (step 1), committed, and recorded step 2 in its second maint().
    assert run.rotation == (1, True)
    assert run.status["maint"] == (
        "scheduled",
        f"job {run.job_ids[1]} * * * * *, last run succeeded at {started:%Y-%m-%d %H:%M:%S}",
    )


def test_pg_cron_defaults_cannot_log_in_to_the_embedded_cluster(live):
    """Only preloading pg_cron is not enough for the embedded cluster: every run fails."""
    run = live[NOAUTH]
    assert live["libpq"].window is not None, "the other clusters' jobs never ran either\n" + run.diagnostics()
    runs = q(
        run.cluster.dsn,
        "SELECT jobid, status, return_message, start_time FROM cron.job_run_details ORDER BY runid",
    )
    assert {r[0] for r in runs} >= set(run.job_ids[:2]), run.diagnostics()
    assert all(r[1:] == ("failed", "connection failed", None) for r in runs), run.diagnostics()
    assert run.delivered == []  # so nothing ticked
    assert f"cron job {run.job_ids[0]} connection failed" in run.cluster.log_tail(100_000)


def test_status_reports_runs_that_failed_to_connect(live):
    run = live[NOAUTH]
    assert run.maint_runs, run.diagnostics()
    for component in ("ticker", "maint"):
        state, detail = run.status[component]
        assert state == "scheduled"
        assert ", last run failed: connection failed" in detail, detail
