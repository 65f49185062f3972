"""Shared fixtures: a real PostgreSQL, a template database migrated once per run, and a
fresh clone of it for every test that asks for ``dsn``.

The server is ``CONVEYOR_TEST_DATABASE_URL`` (default: the machine's PostgreSQL on
127.0.0.1:5432 as ``postgres``). Tests never touch databases they did not create.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import shutil
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg import conninfo

from conveyor.db import embedded, migrate, pool
from support import parallel

ADMIN_DSN = os.environ.get("CONVEYOR_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

# The Spark drivers the tests start (in process, or by the CLI they run) neither create nor
# use a class data sharing archive in the user's cache (conveyor.pipeline.cds);
# tests/pipeline/test_cds.py tests it in a directory of its own.
os.environ["CONVEYOR_SPARK_CDS_DIR"] = ""
# Their JVMs (drivers through spark-submit, the standalone cluster's master and workers)
# compile with the quick compiler only: the tests' Spark work is small, and the optimizing
# compiler's threads cost more CPU than they save (tests/spark/test_partitioned_read.py:
# 100 -> 77 s of CPU), on a machine the whole suite keeps busy.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", "-XX:TieredStopAtLevel=1")


# -- several xdist workers (tests/support/parallel.py) -----------------------------------


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """A module per worker at a time, ``long`` modules first (unless --dist says otherwise)."""
    if config.getvalue("dist") in ("load", "loadfile"):
        return parallel.ModuleScheduling(config, log)
    return None


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture parameters
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    parallel.long_modules_first(items)


def dsn_for(dbname: str) -> str:
    return conninfo.make_conninfo(ADMIN_DSN, dbname=dbname)


def create_database(name: str, template: str | None = None) -> str:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        if template:
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        else:
            admin.execute(f'CREATE DATABASE "{name}" ENCODING UTF8 TEMPLATE template0')
    return dsn_for(name)


def drop_database(name: str) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


class Databases:
    """This worker's database chores off the tests' path: the next clone of the template
    is made (on a thread) while a test runs, and a finished test's database is dropped
    while the next ones run. A DROP DATABASE waits for a checkpoint of the whole server
    (seconds on a busy machine); drops run a few at a time, so they share checkpoints."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.ready: queue.Queue[str | BaseException] = queue.Queue()
        self.to_make: queue.Queue[str | None] = queue.Queue()
        self.maker = threading.Thread(target=self._make, daemon=True)
        self.maker.start()
        self.dropper = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="drop-database")
        self.drops: list[concurrent.futures.Future[None]] = []
        self.to_make.put(unique_name("conveyor_t"))

    def clone(self) -> str:
        """The name of a fresh clone of the template (made ahead), and the next one ordered."""
        made = self.ready.get(timeout=300)
        if isinstance(made, BaseException):
            raise made
        self.to_make.put(unique_name("conveyor_t"))
        return made

    def drop_later(self, name: str) -> None:
        self.drops = [f for f in self.drops if not f.done() or f.exception()]
        self.drops.append(self.dropper.submit(drop_database, name))

    def close(self) -> None:
        """Waits for the chores and drops the clone nobody took; raises a failed drop."""
        self.to_make.put(None)
        self.maker.join()
        while not self.ready.empty():
            made = self.ready.get()
            if isinstance(made, str):
                self.drop_later(made)
        self.dropper.shutdown(wait=True)
        for drop in self.drops:
            drop.result()

    def _make(self) -> None:
        while (name := self.to_make.get()) is not None:
            try:
                create_database(name, template=self.template)
                self.ready.put(name)
            except Exception as exc:  # noqa: BLE001 - raised in the test that waits for it
                self.ready.put(exc)


@pytest.fixture(scope="session")
def template_db() -> Iterator[str]:
    """A database with every migration applied, cloned by ``dsn`` (one per session, so
    one per xdist worker)."""
    name = unique_name("conveyor_tpl")
    dsn = create_database(name)

    async def apply() -> None:
        async with pool.connect(dsn) as conn:
            await migrate.migrate(conn)

    asyncio.run(apply())
    yield name
    drop_database(name)


@pytest.fixture(scope="session")
def databases(template_db: str) -> Iterator[Databases]:
    chores = Databases(template_db)
    yield chores
    chores.close()


@pytest.fixture
def empty_dsn(databases: Databases) -> Iterator[str]:
    """A fresh database with no Conveyor schema."""
    name = unique_name("conveyor_empty")
    yield create_database(name)
    databases.drop_later(name)


@pytest.fixture
def dsn(request: pytest.FixtureRequest, databases: Databases) -> Iterator[str]:
    """A fresh, migrated database for one test (on the worker's own cluster for a test
    marked ``own_cluster``)."""
    if request.node.get_closest_marker("own_cluster") is not None:
        own: OwnCluster = request.getfixturevalue("own_cluster")
        name = own.clone()
        yield own.dsn_for(name)
        own.drop(name)
        return
    name = databases.clone()
    yield dsn_for(name)
    databases.drop_later(name)


class OwnCluster:
    """A PostgreSQL cluster of this worker's own (an embedded one, started on first use),
    for tests marked ``own_cluster``: tests that need no transaction older than theirs
    anywhere on the server. Stream rotation waits for every transaction older than its
    switch, in any database of the cluster (a txid snapshot is the cluster's), so on the
    shared server other workers' tests (and their CREATE/DROP DATABASE) hold it back."""

    def __init__(self) -> None:
        self.data_dir = Path(tempfile.mkdtemp(prefix="conveyor-own-cluster-", dir="/tmp"))
        os.chmod(self.data_dir, 0o755)  # traversable by the user PostgreSQL runs as under root
        self.pg = embedded.EmbeddedPostgres(self.data_dir)
        self.admin = self.pg.start()
        self.templates: dict[tuple[str, ...], str] = {}

    def dsn_for(self, name: str) -> str:
        return conninfo.make_conninfo(self.admin, dbname=name)

    def clone(self, dialects: tuple[str, ...] = ()) -> str:
        """A fresh database migrated with ``dialects`` (a template per set, made once)."""
        if dialects not in self.templates:
            template = unique_name("conveyor_tpl")
            with psycopg.connect(self.admin, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{template}" ENCODING UTF8 TEMPLATE template0')

            async def apply() -> None:
                async with pool.connect(self.dsn_for(template)) as conn:
                    await migrate.migrate(conn, dialects=dialects)

            asyncio.run(apply())
            self.templates[dialects] = template
        name = unique_name("conveyor_t")
        with psycopg.connect(self.admin, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.templates[dialects]}"')
        return name

    def drop(self, name: str) -> None:
        with psycopg.connect(self.admin, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        self.pg.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def own_cluster() -> Iterator[OwnCluster]:
    cluster = OwnCluster()
    yield cluster
    cluster.close()


@pytest.fixture
async def conn(dsn: str) -> AsyncIterator[psycopg.AsyncConnection]:
    async with pool.connect(dsn) as c:
        yield c


# -- a real server process -------------------------------------------------------------

from support.server import ServerProcess  # noqa: E402


@pytest.fixture(scope="module")
def module_dsn(template_db: str, databases: Databases) -> Iterator[str]:
    name = unique_name("conveyor_m")
    yield create_database(name, template=template_db)
    databases.drop_later(name)


@pytest.fixture(scope="module")
def server(module_dsn: str) -> Iterator[ServerProcess]:
    """One server per test module (default settings: header auth, fusion on)."""
    proc = ServerProcess(module_dsn).start()
    yield proc
    proc.kill()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


@pytest.fixture
def queue_name() -> str:
    """A queue name no other test uses."""
    return unique_name("q")
