"""Migrations: idempotent, data-preserving, and equal to the one-file psql install."""

from __future__ import annotations

import subprocess

import pytest

from conveyor import errors, types
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
        assert [m.label for m in applied] == [m.label for m in migrate.migrations() + migrate.functions()]
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
    assert sorted(results) == [0, 0, 0, len(migrate.migrations()) + len(migrate.functions())]


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


async def test_a_database_migrated_by_another_build_is_refused(dsn, conn):
    """A migration edited after it was applied (the old habit) left databases with old
    functions, silently; now its recorded checksum no longer matches and Conveyor says so."""
    first = migrate.migrations()[0]
    await conn.execute("UPDATE conveyor.schema_migrations SET checksum = %s WHERE version = %s",
                       ("0" * 64, first.version))
    for check in (migrate.migrate(conn), migrate.verify(conn)):
        with pytest.raises(errors.SchemaMismatch) as info:
            await check
        assert first.label in info.value.message and "--accept-checksums" in info.value.message
    assert await migrate.migrate(conn, accept_checksums=True) == []
    await migrate.verify(conn)


async def test_checksums_are_recorded_and_filled_in_for_older_databases(dsn, conn):
    cur = await conn.execute("SELECT version, checksum FROM conveyor.schema_migrations ORDER BY version")
    assert await cur.fetchall() == [(m.version, m.checksum) for m in migrate.migrations()]
    await conn.execute("ALTER TABLE conveyor.schema_migrations DROP COLUMN checksum")  # as before checksums
    assert [s.applied_at is not None for s in await migrate.status(conn)] == [True] * len(migrate.migrations())
    await migrate.verify(conn)
    assert await migrate.migrate(conn) == []
    cur = await conn.execute("SELECT count(*) FROM conveyor.schema_migrations WHERE checksum IS NOT NULL")
    assert (await cur.fetchone())[0] == len(migrate.migrations())


def test_a_server_refuses_to_start_on_a_mismatched_database(dsn):
    import psycopg

    from support.server import ServerProcess
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("UPDATE conveyor.schema_migrations SET checksum = repeat('0', 64) WHERE version = 1")
    for env in ({}, {"CONVEYOR_MIGRATE": "false"}):
        server = ServerProcess(dsn, env=env)
        with pytest.raises(RuntimeError) as info:
            server.start(timeout=20)
        assert "differs from this build's" in str(info.value)


async def test_a_migration_missing_below_applied_ones_is_refused(dsn, conn, tmp_path):
    """Numbers may leave gaps (parallel work takes numbers ahead of time), but a database
    is migrated in number order only: one that has a later migration and lacks an earlier
    one was migrated by another build, and getting the earlier one late could undo the
    later one's definitions."""
    versions = [m.version for m in migrate.migrations()]
    assert versions == sorted(set(versions))
    missing = migrate.migrations()[-2]
    await conn.execute("DELETE FROM conveyor.schema_migrations WHERE version = %s", (missing.version,))
    with pytest.raises(errors.SchemaMismatch) as info:
        await migrate.migrate(conn)
    assert missing.label in info.value.message and "number order" in info.value.message
    script = tmp_path / "conveyor.sql"
    script.write_text(migrate.bundle())
    done = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(script), dsn],
                          capture_output=True, text=True)
    assert done.returncode != 0 and f"migration {missing.label} is not applied but later ones are" in done.stderr


async def test_a_dialect_migration_missing_below_applied_ones_is_refused(empty_dsn):
    async with pool.connect(empty_dsn) as conn:
        await migrate.migrate(conn, dialects=("pgmq",))
        first, *later = migrate.migrations("pgmq")
        assert later, "the pgmq dialect has more than one migration"
        await conn.execute("DELETE FROM conveyor.dialect_migrations WHERE dialect = 'pgmq' AND version = %s",
                           (first.version,))
        with pytest.raises(errors.SchemaMismatch, match="pgmq/0001_pgmq is not applied"):
            await migrate.migrate(conn)


async def _function_text(conn, signature: str) -> str:
    cur = await conn.execute("SELECT pg_get_functiondef(%s::regprocedure)", (signature,))
    return (await cur.fetchone())[0]


async def _as_another_build(conn, signature: str = "conveyor._name_check(text)") -> migrate.Migration:
    """The database as another build left it: one functions file recorded with other text,
    and a function of it defined otherwise."""
    body = await _function_text(conn, signature)
    await conn.execute(body.replace("$function$\n", "$function$\n-- another build's\n", 1))
    changed = migrate.functions()[0]
    await conn.execute("UPDATE conveyor.schema_functions SET checksum = %s WHERE scope = 'conveyor' AND name = %s",
                       ("0" * 64, changed.stem))
    return changed


async def test_functions_files_are_applied_again_when_they_differ(dsn, conn):
    """Functions files are repeatable: `migrate` re-applies them whenever the database
    records other text (an older build's functions); a server that does not migrate
    refuses such a database, as it refuses a migration that differs."""
    fresh = await _function_text(conn, "conveyor._name_check(text)")
    changed = await _as_another_build(conn)
    with pytest.raises(errors.SchemaMismatch) as info:
        await migrate.verify(conn)
    assert f"functions/{changed.stem}" in info.value.message and "conveyor db migrate" in info.value.message
    applied = await migrate.migrate(conn)
    assert [m.label for m in applied] == [f.label for f in migrate.functions()]
    assert await _function_text(conn, "conveyor._name_check(text)") == fresh
    await migrate.verify(conn)
    assert await migrate.migrate(conn) == []
    await conn.execute("DELETE FROM conveyor.schema_functions WHERE name = %s", (changed.stem,))
    with pytest.raises(errors.SchemaMismatch):  # a file never applied differs too
        await migrate.verify(conn)


async def test_a_database_migrated_by_a_newer_build_keeps_its_functions(dsn, conn, tmp_path):
    """A newer build's migration this build does not have: its functions are newer than
    this build's, so neither `migrate` nor the psql script puts this build's back."""
    await _as_another_build(conn)
    newer = await _function_text(conn, "conveyor._name_check(text)")
    last = migrate.migrations()[-1].version
    await conn.execute("INSERT INTO conveyor.schema_migrations (version, name, checksum) VALUES (%s, 'later', %s)",
                       (last + 1, "1" * 64))
    with pytest.raises(errors.SchemaMismatch, match=f"{last + 1:04d} recorded in this database is not in this build"):
        await migrate.migrate(conn)
    script = tmp_path / "conveyor.sql"
    script.write_text(migrate.bundle())
    done = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(script), dsn],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "migrated by a newer build" in done.stderr
    assert await _function_text(conn, "conveyor._name_check(text)") == newer


def test_a_server_that_does_not_migrate_refuses_other_functions(dsn):
    import asyncio

    from support.server import ServerProcess

    async def other() -> None:
        async with pool.connect(dsn) as conn:
            await _as_another_build(conn)

    asyncio.run(other())
    server = ServerProcess(dsn, env={"CONVEYOR_MIGRATE": "false"})
    with pytest.raises(RuntimeError) as info:
        server.start(timeout=20)
    assert "the functions in this database are not this build's" in str(info.value)
