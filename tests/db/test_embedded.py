"""Real-process tests for the embedded PostgreSQL cluster (no mocks).

Each test gets its own data directory directly under /tmp: pytest's tmp_path
lives below /tmp/pytest-of-<user>, which is 0700, and when the tests run as
root the cluster runs as an unprivileged user that must traverse every parent
of the data directory. Every cluster a test starts is stopped in teardown,
whoever owns it, so nothing is left running.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from conveyor.db.embedded import EmbeddedError, EmbeddedPostgres, find_binaries

pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[2] / "src"
IS_ROOT = os.geteuid() == 0


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A not-yet-existing data directory whose parents any user can traverse."""
    base = Path(tempfile.mkdtemp(prefix="conveyor-embedded-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield base / "data"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def make() -> Iterator[Callable[[Path], EmbeddedPostgres]]:
    """Factory for EmbeddedPostgres objects; teardown stops every cluster they touched."""
    made: list[EmbeddedPostgres] = []

    def factory(path: Path) -> EmbeddedPostgres:
        pg = EmbeddedPostgres(path)
        made.append(pg)
        return pg

    yield factory
    for pg in made:
        pg.stop()  # owners stop; the others are no-ops
    for pg in made:
        if pg.is_running():  # e.g. a test failed while a subprocess owned it
            pg._pg_ctl("stop", "-w", "-m", "immediate", check=False, timeout=60)


def query(dsn: str, sql: str) -> object:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
        return row[0] if row else None


def test_first_start_initialises_and_accepts_connections(data_dir, make):
    pg = make(data_dir)
    assert not pg.is_running()

    dsn = pg.start()

    url = urlsplit(dsn)
    assert (url.scheme, url.hostname, url.username, url.path) == ("postgresql", "127.0.0.1", "conveyor", "/conveyor")
    assert url.port != 5432
    assert pg.is_running() and pg.owns_cluster
    assert query(dsn, "SHOW server_encoding") == "UTF8"
    assert query(dsn, "SHOW listen_addresses") == "127.0.0.1"
    assert query(dsn, "SHOW port") == str(url.port)
    assert query(dsn, "SHOW fsync") == "on"
    assert query(dsn, "SHOW max_connections") == "200"
    assert query(dsn, "SELECT current_database()") == "conveyor"
    assert query(dsn, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user") is True
    # The unix socket is private to the data directory, away from the system cluster's.
    assert (data_dir / "sock" / f".s.PGSQL.{url.port}").exists()

    # Layout and permissions.
    assert stat.S_IMODE(data_dir.stat().st_mode) == (0o710 if IS_ROOT else 0o700)
    credentials = data_dir / "credentials"
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    assert credentials.stat().st_uid == os.geteuid()
    assert credentials.read_text().strip() == url.password
    assert (data_dir / "port").read_text().strip() == str(url.port)
    assert (data_dir / "pgdata" / "PG_VERSION").exists()
    if IS_ROOT:
        assert (data_dir / "pgdata").stat().st_uid != 0
        assert (data_dir / "postgres.log").stat().st_uid == (data_dir / "pgdata").stat().st_uid

    assert pg.start() == dsn  # idempotent
    pg.stop()
    assert not pg.is_running() and not pg.owns_cluster


def test_stop_then_start_reuses_data_and_port(data_dir, make):
    first = make(data_dir)
    dsn = first.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v text)")
        conn.execute("INSERT INTO kept VALUES ('still here')")
    first.stop()
    assert not first.is_running()

    second = make(data_dir)
    assert second.start() == dsn  # same password and same port
    assert query(dsn, "SELECT v FROM kept") == "still here"
    second.stop()

    assert first.start() == dsn  # a stopped object can start again
    first.stop()
    assert not first.is_running()


def test_second_object_uses_but_does_not_stop_a_cluster_it_does_not_own(data_dir, make):
    owner = make(data_dir)
    dsn = owner.start()

    guest = make(data_dir)
    assert guest.start() == dsn
    assert not guest.owns_cluster
    guest.stop()
    assert owner.is_running()
    assert query(dsn, "SELECT 1") == 1

    owner.stop()
    assert not owner.is_running()
    # With the owner gone, the guest takes over on its next start.
    assert guest.start() == dsn
    assert guest.owns_cluster
    guest.stop()
    assert not guest.is_running()


# Starts a cluster, reports "<owner> <dsn>", then stops it when stdin closes.
CHILD = """\
import sys
from pathlib import Path
from conveyor.db.embedded import EmbeddedPostgres
pg = EmbeddedPostgres(Path(sys.argv[1]))
dsn = pg.start()
print(pg.owns_cluster, dsn, flush=True)
sys.stdin.read()
pg.stop()
"""


def spawn_child(data_dir: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_crashed_owner_is_adopted_and_stopped(data_dir, make):
    child = spawn_child(data_dir)
    try:
        owner, dsn = child.stdout.readline().split()
    finally:
        child.send_signal(signal.SIGKILL)  # the owner dies without stopping the cluster
        child.wait(timeout=10)
        child.stdin.close()
        child.stdout.close()
    assert owner == "True"

    adopter = make(data_dir)
    assert adopter.is_running()
    assert adopter.start() == dsn
    assert adopter.owns_cluster
    assert query(dsn, "SELECT 1") == 1
    adopter.stop()
    assert not adopter.is_running()


def test_concurrent_first_starts_share_one_cluster(data_dir, make):
    children = [spawn_child(data_dir) for _ in range(3)]
    try:
        reports = [child.stdout.readline().split() for child in children]
    finally:
        for child in children:  # the owner stops the cluster; the guests do nothing
            child.stdin.close()
            child.wait(timeout=60)
            child.stdout.close()
    assert all(len(report) == 2 for report in reports), reports
    assert sorted(owner for owner, _ in reports) == ["False", "False", "True"]
    assert len({dsn for _, dsn in reports}) == 1
    assert urlsplit(reports[0][1]).port != 5432
    assert all(child.returncode == 0 for child in children)
    assert not make(data_dir).is_running()  # the owner stopped it on exit


def test_restart_bounces_the_server_and_keeps_data(data_dir, make):
    pg = make(data_dir)
    dsn = pg.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept AS SELECT 42 AS v")
        started = conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0]

    pg.restart()

    assert pg.dsn == dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SELECT v FROM kept").fetchone()[0] == 42
        assert conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0] > started
    pg.stop()
    assert not pg.is_running()


def test_extra_settings_are_added_to_and_override_the_defaults(data_dir):
    pg = EmbeddedPostgres(
        data_dir,
        settings={"max_connections": 50, "cluster_name": "it's conveyor", "log_connections": True, "jit": False},
    )
    plain = EmbeddedPostgres(data_dir)  # settings belong to the object, rewritten on every start
    try:
        dsn = pg.start()
        assert query(dsn, "SHOW max_connections") == "50"  # overrides SERVER_SETTINGS
        assert query(dsn, "SHOW cluster_name") == "it's conveyor"  # added, quoted
        assert query(dsn, "SHOW log_connections") == "on"
        assert query(dsn, "SHOW jit") == "off"
        assert query(dsn, "SHOW shared_buffers") == "128MB"  # the other defaults stay
        assert query(dsn, "SHOW fsync") == "on"
        assert query(dsn, "SHOW port") == str(urlsplit(dsn).port)
        conf = (data_dir / "pgdata" / "conveyor.conf").read_text()
        assert "max_connections = 50\n" in conf and "max_connections = 200" not in conf
        pg.stop()

        assert plain.start() == dsn
        assert query(dsn, "SHOW max_connections") == "200"
        assert query(dsn, "SHOW cluster_name") == ""
        plain.stop()
    finally:
        pg.stop()
        plain.stop()
        if pg.is_running():
            pg._pg_ctl("stop", "-w", "-m", "immediate", check=False, timeout=60)

    for bad in ("port", "unix_socket_directories", "max_connections = 1\nfsync", ""):
        with pytest.raises(EmbeddedError, match="cannot set"):
            EmbeddedPostgres(data_dir, settings={bad: "x"})


def test_stale_postmaster_pid_after_server_crash_does_not_prevent_start(data_dir, make):
    pg = make(data_dir)
    dsn = pg.start()
    pid_file = data_dir / "pgdata" / "postmaster.pid"
    os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pg.is_running():
        assert time.monotonic() < deadline, "postmaster did not die"
        time.sleep(0.05)
    assert pid_file.exists()  # stale

    assert pg.start() == dsn
    assert query(dsn, "SELECT 1") == 1
    pg.stop()
    assert not pg.is_running()


def test_failed_start_releases_ownership(data_dir, make):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        busy = squatter.getsockname()[1]
        pg = EmbeddedPostgres(data_dir, port=busy)
        with pytest.raises(EmbeddedError, match=f"port {busy}"):
            pg.start()
        assert not pg.owns_cluster and not pg.is_running()

    other = make(data_dir)  # the failed owner let go of owner.lock
    dsn = other.start()
    assert other.owns_cluster
    assert urlsplit(dsn).port not in (busy, 5432)
    other.stop()


def _fake_bin_dir(path: Path) -> Path:
    path.mkdir()
    for name in ("initdb", "pg_ctl", "postgres"):
        (path / name).write_text("#!/bin/sh\nexit 1\n")
        (path / name).chmod(0o755)
    return path


def test_find_binaries_honours_conveyor_pg_bin(monkeypatch, tmp_path):
    fake = _fake_bin_dir(tmp_path / "bin")
    monkeypatch.setenv("CONVEYOR_PG_BIN", str(fake))
    assert find_binaries() == fake


def test_find_binaries_explains_an_empty_conveyor_pg_bin(monkeypatch, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("CONVEYOR_PG_BIN", str(empty))

    with pytest.raises(EmbeddedError) as raised:
        find_binaries()
    message = str(raised.value)
    for needle in (str(empty), "initdb", "pg_ctl", "postgres", "CONVEYOR_PG_BIN", "DATABASE_URL"):
        assert needle in message

    with pytest.raises(EmbeddedError, match="CONVEYOR_PG_BIN"):
        EmbeddedPostgres(tmp_path / "data").start()
    assert not (tmp_path / "data").exists()  # failed before touching the disk


def test_find_binaries_falls_back_to_the_pgserver_package(monkeypatch, tmp_path):
    """No PostgreSQL on PATH nor under /usr/lib/postgresql: PyPI's pgserver binaries."""
    import conveyor.db.embedded as embedded

    monkeypatch.delenv("CONVEYOR_PG_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(embedded, "DEBIAN_ROOT", str(tmp_path / "nowhere"))
    found = find_binaries()
    assert found.parts[-3:] == ("pgserver", "pginstall", "bin")


def test_pgserver_binaries_run_a_cluster(monkeypatch, make):
    """The binaries from PyPI drive a real cluster like any installation. They are
    copied (with the libraries they link) under /tmp so that the unprivileged run user
    can reach them wherever the virtualenv lives."""
    import importlib.util

    site = Path(importlib.util.find_spec("pgserver").origin).parent.parent
    root = Path(tempfile.mkdtemp(prefix="conveyor-pgserver-", dir="/tmp"))
    try:
        shutil.copytree(site / "pgserver" / "pginstall", root / "pgserver" / "pginstall", symlinks=True)
        shutil.copytree(site / "pgserver.libs", root / "pgserver.libs", symlinks=True)
        for path in [root, *root.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o555 if path.is_dir() else path.stat().st_mode | 0o444)
        monkeypatch.setenv("CONVEYOR_PG_BIN", str(root / "pgserver" / "pginstall" / "bin"))
        data = Path(tempfile.mkdtemp(prefix="conveyor-pgserver-data-", dir="/tmp"))
        data.chmod(0o755)
        pg = make(data)
        with psycopg.connect(pg.start()) as conn:
            version = conn.execute("SHOW server_version_num").fetchone()[0]
        assert int(version) >= 160000
        pg.stop()
        shutil.rmtree(data, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_two_databases_of_a_new_cluster_migrate_at_once(data_dir, make):
    """Roles are the cluster's, outside the database's advisory lock: two servers started
    together, each on its own database of a new cluster, both create them. The one that
    commits second lost the race (a unique violation in pg_authid) and failed to start;
    it migrates again and finds them."""
    from psycopg import conninfo

    from conveyor.db import migrate, pool

    dsn = make(data_dir).start()
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("CREATE DATABASE first")
        admin.execute("CREATE DATABASE second")
    async with await psycopg.AsyncConnection.connect(conninfo.make_conninfo(dsn, dbname="first")) as racer:
        # the first migration's creation of a role, not committed yet: the second's waits on it
        await racer.execute("CREATE ROLE conveyor_reader NOLOGIN")
        async with pool.connect(conninfo.make_conninfo(dsn, dbname="second")) as conn:
            [(pid,)] = await (await conn.execute("SELECT pg_backend_pid()")).fetchall()
            second = asyncio.create_task(migrate.migrate(conn))
            for _ in range(1000):
                blocked = query(dsn, f"SELECT cardinality(pg_blocking_pids({pid})) > 0")
                if blocked or second.done():
                    break
                await asyncio.sleep(0.01)
            assert blocked, "the second migration did not wait for the role"
            await racer.commit()
            assert [m.label for m in await second] == [m.label for m in migrate.migrations() + migrate.functions()]
    async with pool.connect(conninfo.make_conninfo(dsn, dbname="first")) as conn:
        assert await migrate.migrate(conn)
    assert query(dsn, "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'conveyor\\_%'") == 3
