"""A database upgraded step by step from the oldest landed schema and one installed fresh by
this build are the same database, catalog compared object by object (tables, columns,
indexes, constraints, sequences, views, triggers, types, functions with their bodies and
settings, grants), for the engine and every dialect; and so is one installed from
`conveyor db sql` with psql.

The upgraded one is made as the builds before it made it: each landed migration applied
by a build that had it as its newest (``migrate`` with that build's migrations and no
functions files: the functions were in the migrations then), so it starts with the old
functions; then this build's ``migrate`` (its later migrations, then its functions files).
"""

from __future__ import annotations

import runpy
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from conftest import create_database, drop_database, unique_name
from conveyor.db import migrate, pool
from support import catalog

_LANDED = runpy.run_path(str(Path(__file__).with_name("test_migrations_landed.py")))
LANDED: dict[str, str] = _LANDED["LANDED"]
LANDED_DIALECTS: dict[str, str] = _LANDED["LANDED_DIALECTS"]
ALL_DIALECTS = tuple(migrate.DIALECTS)


@pytest.fixture
def fresh() -> Iterator[str]:
    """A second empty database, for the fresh install."""
    name = unique_name("conveyor_fresh")
    yield create_database(name)
    drop_database(name)


# The dialects' first migrations were installed on the engine of their time: 0013 (before
# 0016 turned the messages tables into partitioned ones, which must keep their indexes).
DIALECTS_FROM = 13


def _steps() -> list[tuple[str | None, str]]:
    engine = sorted(LANDED)
    first = [label for label in sorted(LANDED_DIALECTS) if label.split("/")[1].startswith("0001_")]
    later = [label for label in sorted(LANDED_DIALECTS) if label not in first]
    steps: list[tuple[str | None, str]] = []
    for label in engine:
        steps.append((None, label))
        if label.startswith(f"{DIALECTS_FROM:04d}_"):
            steps += [(d.split("/")[0], d) for d in first]
    return steps + [(d.split("/")[0], d) for d in later]


async def _upgraded_step_by_step(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    current_migrations = migrate.migrations
    built: set[str] = set()
    async with pool.connect(dsn) as conn:
        for dialect, label in _steps():
            built.add(label)
            with monkeypatch.context() as older:  # the build whose newest migration this is
                older.setattr(migrate, "migrations",
                              lambda d=None, built=frozenset(built): [m for m in current_migrations(d)
                                                                      if m.label in built])
                older.setattr(migrate, "functions", lambda d=None: [])
                applied = await migrate.migrate(conn, dialects=(dialect,) if dialect else ())
            assert [m.label for m in applied] == [label]
        applied = await migrate.migrate(conn, dialects=ALL_DIALECTS)  # this build
    assert {m.label for m in applied} >= {f.label for d in (None, *ALL_DIALECTS) for f in migrate.functions(d)}


async def _fresh(dsn: str) -> None:
    async with pool.connect(dsn) as conn:
        await migrate.migrate(conn, dialects=ALL_DIALECTS)


def _equal(upgraded: str, fresh: str) -> None:
    a, b = catalog.snapshot(upgraded), catalog.snapshot(fresh)
    assert any(key.startswith("function conveyor._claim(") for key in b)
    assert all(any(key.startswith(f"function {schema}.") for key in b) for schema in ALL_DIALECTS)
    differences = catalog.differences(a, b)
    assert "index conveyor.hq_messages_uuid_idx" in a
    assert not differences, "\n".join(differences[:40])


async def test_an_upgraded_database_is_a_fresh_one(empty_dsn, fresh, monkeypatch):
    await _upgraded_step_by_step(empty_dsn, monkeypatch)
    await _fresh(fresh)
    _equal(empty_dsn, fresh)


async def test_the_psql_install_is_a_fresh_one(empty_dsn, fresh, tmp_path):
    script = tmp_path / "conveyor.sql"
    script.write_text(migrate.bundle(ALL_DIALECTS))
    for _ in range(2):  # the second run changes nothing
        subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(script), empty_dsn],
                       check=True, capture_output=True, text=True)
    await _fresh(fresh)
    _equal(empty_dsn, fresh)
    async with pool.connect(empty_dsn) as conn:
        assert await migrate.migrate(conn) == []  # the script recorded its migrations and functions
        await migrate.verify(conn)


def test_the_comparison_sees_a_missing_function_and_a_changed_body(dsn):
    """The comparison is only as good as what it notices: a function in one database only,
    a body or a setting that differs."""
    before = catalog.snapshot(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION conveyor.only_here() RETURNS int LANGUAGE sql AS 'SELECT 1'")
        conn.execute("ALTER FUNCTION conveyor.message_pop(text, integer) SET work_mem = '1MB'")
        body = conn.execute("SELECT pg_get_functiondef('conveyor._name_check(text)'::regprocedure)").fetchone()[0]
        conn.execute(body.replace("$function$\n", "$function$\n-- changed\n", 1))
    found = "\n".join(catalog.differences(before, catalog.snapshot(dsn)))
    assert "only in the second: function conveyor.only_here()" in found
    assert "differs: function settings conveyor.message_pop(text,integer)" in found
    assert "differs: function conveyor._name_check(" in found


async def test_the_functions_left_in_migrations_are_part_of_a_table(fresh):
    """The one exception to "no function in a numbered migration after the landed ones"
    (test_migrations_landed.TABLE_FUNCTIONS): a function a table's definition uses."""
    await _fresh(fresh)
    names = sorted(name for names in _LANDED["TABLE_FUNCTIONS"].values() for name in names)
    assert names
    with psycopg.connect(fresh, autocommit=True) as conn:
        used = {row[0] for row in conn.execute(
            """SELECT DISTINCT p.pronamespace::regnamespace || '.' || p.proname FROM pg_depend d
                 JOIN pg_proc p ON p.oid = d.refobjid
                WHERE d.refclassid = 'pg_proc'::regclass
                  AND d.classid IN ('pg_attrdef'::regclass, 'pg_constraint'::regclass, 'pg_index'::regclass)""")}
    assert set(names) <= used, set(names) - used
