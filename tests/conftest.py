"""Shared fixtures: a real PostgreSQL, a template database migrated once per run, and a
fresh clone of it for every test that asks for ``dsn``.

The server is ``CONVEYOR_TEST_DATABASE_URL`` (default: the machine's PostgreSQL on
127.0.0.1:5432 as ``postgres``). Tests never touch databases they did not create.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import psycopg
import pytest
from psycopg import conninfo

from conveyor.db import migrate, pool

ADMIN_DSN = os.environ.get("CONVEYOR_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


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


@pytest.fixture(scope="session")
def template_db() -> Iterator[str]:
    """A database with every migration applied, cloned by ``dsn``."""
    name = unique_name("conveyor_tpl")
    dsn = create_database(name)

    async def apply() -> None:
        async with pool.connect(dsn) as conn:
            await migrate.migrate(conn)

    asyncio.run(apply())
    yield name
    drop_database(name)


@pytest.fixture
def empty_dsn() -> Iterator[str]:
    """A fresh database with no Conveyor schema."""
    name = unique_name("conveyor_empty")
    yield create_database(name)
    drop_database(name)


@pytest.fixture
def dsn(template_db: str) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    name = unique_name("conveyor_t")
    yield create_database(name, template=template_db)
    drop_database(name)


@pytest.fixture
async def conn(dsn: str) -> AsyncIterator[psycopg.AsyncConnection]:
    async with pool.connect(dsn) as c:
        yield c


# -- a real server process -------------------------------------------------------------

from support.server import ServerProcess  # noqa: E402


@pytest.fixture(scope="module")
def module_dsn(template_db: str) -> Iterator[str]:
    name = unique_name("conveyor_m")
    yield create_database(name, template=template_db)
    drop_database(name)


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
