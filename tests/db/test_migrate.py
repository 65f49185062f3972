"""Migrations: idempotent, data-preserving, and equal to the one-file psql install."""

from __future__ import annotations

import subprocess

from conveyor import types
from conveyor.core import messages, queues
from conveyor.db import migrate, pool


async def test_migrate_twice_keeps_queues_and_messages(dsn, conn):
    await queues.create(conn, "jobs", {"visibility_timeout": 7})
    ids = [s.id for s in await messages.send_batch(conn, "jobs", [types.OutgoingMessage(str(i)) for i in range(10)])]
    await messages.receive(conn, "jobs", qty=3)
    for _ in range(2):
        assert await migrate.migrate(conn) == []  # nothing left to apply
    assert (await queues.get(conn, "jobs")).visibility_timeout == 7
    assert [m.id for m in await messages.peek(conn, "jobs", qty=100)] == ids
    assert (await queues.metrics(conn, "jobs")).in_flight == 3


async def test_migrate_on_empty_database_applies_everything(empty_dsn):
    async with pool.connect(empty_dsn) as conn:
        applied = await migrate.migrate(conn)
        assert [m.version for m in applied] == [m.version for m in migrate.migrations()]
        assert all(s.applied_at for s in await migrate.status(conn))
        assert await migrate.migrate(conn) == []


async def test_status_before_migrating(empty_dsn):
    async with pool.connect(empty_dsn) as conn:
        assert all(s.applied_at is None for s in await migrate.status(conn))


def _schema_dump(dsn: str) -> str:
    out = subprocess.run(["pg_dump", "--schema-only", "--schema=conveyor", "--no-owner", dsn],
                         check=True, capture_output=True, text=True).stdout
    return "\n".join(line for line in out.splitlines()
                     if not line.startswith(("--", "\\restrict", "\\unrestrict")))


async def test_bundle_installs_from_psql_and_equals_migrate(empty_dsn, dsn, tmp_path):
    script = tmp_path / "conveyor.sql"
    script.write_text(migrate.bundle())
    subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(script), empty_dsn],
                   check=True, capture_output=True, text=True)
    assert _schema_dump(empty_dsn) == _schema_dump(dsn)  # dsn: migrated by `migrate`
    async with pool.connect(empty_dsn) as conn:
        assert await migrate.migrate(conn) == []  # the bundle recorded its versions
        await queues.create(conn, "jobs")
        assert await messages.send(conn, "jobs", types.OutgoingMessage("x")) == 1


async def test_concurrent_migrations_serialise(empty_dsn):
    import asyncio

    async def run() -> int:
        async with pool.connect(empty_dsn) as conn:
            return len(await migrate.migrate(conn))

    results = await asyncio.gather(*(run() for _ in range(4)))
    assert sorted(results) == [0, 0, 0, len(migrate.migrations())]


async def test_bundle_runs_again_safely_and_keeps_data(empty_dsn, tmp_path):
    script = tmp_path / "conveyor.sql"
    script.write_text(migrate.bundle())
    psql = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(script), empty_dsn]
    subprocess.run(psql, check=True, capture_output=True, text=True)
    async with pool.connect(empty_dsn) as conn:
        await queues.create(conn, "jobs")
        await messages.send(conn, "jobs", types.OutgoingMessage("kept"))
    again = subprocess.run(psql, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    async with pool.connect(empty_dsn) as conn:
        assert [m.body for m in await messages.peek(conn, "jobs")] == ["kept"]
        assert await migrate.migrate(conn) == []
