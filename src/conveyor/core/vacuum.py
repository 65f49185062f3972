"""Conveyor's own VACUUM of its tables: those whose dead row versions passed the bar of
``conveyor.tables_to_vacuum()`` (500 plus 5% of their live rows), whatever autovacuum
does. A busy queue's receives and deletes leave index entries that every later claim
walks until a VACUUM removes them (docs/architecture.md, "Vacuum")."""

from __future__ import annotations

from conveyor.db import execute as db
from conveyor.db import pool

Connection = db.Connection
LOCK_KEY = 7306554615  # pg_try_advisory_lock key: one process per database vacuums


async def take_lock(conn: Connection) -> bool:
    """On a connection held for as long as this process vacuums: whether it is the one."""
    return bool(await db.fetch_value(conn, "lock_try_advisory", {"key": LOCK_KEY}))


async def due(conn: Connection) -> list[str]:
    """The tables over the bar, the most dead row versions first ("schema.table")."""
    return await db.fetch_column(conn, "table_vacuum_due")


async def run(conn: Connection) -> list[str]:
    """VACUUM every table over the bar (on an autocommit connection; one that another
    VACUUM holds is skipped, not waited for, and one dropped since it was listed is let
    be); returns the tables vacuumed."""
    return [table for table in await due(conn) if await pool.vacuum(conn, table)]
