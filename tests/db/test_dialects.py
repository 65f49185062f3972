"""Dialect installation (conveyor.db.migrate): optional, recorded with checksums, and
refused next to the real extension or a foreign schema of the same name."""

from __future__ import annotations

import pytest

from conveyor import errors
from conveyor.db import migrate, pool


def test_dialect_names_are_checked():
    assert migrate.parse_dialects(" pgmq, PGQ ,pgmq") == ("pgmq", "pgq")
    assert migrate.parse_dialects("") == ()
    with pytest.raises(errors.InvalidInput, match="unknown dialect 'kafka'"):
        migrate.parse_dialects("pgmq,kafka")


async def test_an_unknown_dialect_changes_nothing(empty_dsn):
    async with pool.connect(empty_dsn) as conn:
        with pytest.raises(errors.InvalidInput):
            await migrate.migrate(conn, dialects=("nope",))
        assert all(s.applied_at is None for s in await migrate.status(conn))


@pytest.mark.parametrize("dialect", sorted(migrate.DIALECTS))
async def test_a_foreign_schema_of_the_same_name_is_refused(empty_dsn, dialect):
    async with pool.connect(empty_dsn) as conn:
        await conn.execute(f"CREATE SCHEMA {migrate.DIALECTS[dialect]}")
        await conn.execute(f"CREATE TABLE {migrate.DIALECTS[dialect]}.theirs (id int)")
        with pytest.raises(errors.SchemaMismatch, match="Conveyor did not create"):
            await migrate.migrate(conn, dialects=(dialect,))
        # nothing was applied, their schema is untouched, and without the dialect all is well
        assert await migrate.installed_dialects(conn) == []
        await migrate.migrate(conn)
        cur = await conn.execute(f"SELECT count(*) FROM {migrate.DIALECTS[dialect]}.theirs")
        assert await cur.fetchone() == (0,)
