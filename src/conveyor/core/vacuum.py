"""Conveyor's own VACUUM of its tables: those whose dead row versions passed the bar of
``conveyor.tables_to_vacuum()`` (500 plus 5% of their live rows), whatever autovacuum
does. A busy queue's receives and deletes leave index entries that every later claim
walks until a VACUUM removes them (docs/architecture.md, "Vacuum")."""

from __future__ import annotations

from collections.abc import Mapping

from conveyor.db import execute as db
from conveyor.db import pool

Connection = db.Connection
LOCK_KEY = 7306554615  # pg_try_advisory_lock key: one process per database vacuums


async def take_lock(conn: Connection) -> bool:
    """On a connection held for as long as this process vacuums: whether it is the one."""
    return bool(await db.fetch_value(conn, "lock_try_advisory", {"key": LOCK_KEY}))


async def due(conn: Connection, kept: Mapping[str, int] | None = None) -> list[str]:
    """The tables over the bar, the most dead row versions first ("schema.table"); ``kept``:
    the dead row versions the last VACUUM of a table left (``Vacuumer``), not counted."""
    return await db.fetch_column(conn, "table_vacuum_due", {"kept": dict(kept or {})})


class Vacuumer:
    """VACUUMs the tables over the bar, remembering what each VACUUM could not remove: dead
    row versions that a transaction older than them may still see (a long export, a
    backup) stay until it ends, and only dead rows beyond those count for the next look.
    Without that, one long transaction would have every look vacuum the busiest tables
    again for nothing."""

    def __init__(self) -> None:
        self.kept: dict[str, int] = {}

    async def run(self, conn: Connection) -> list[str]:
        """VACUUM every table over the bar (on an autocommit connection; one that another
        VACUUM holds is skipped, not waited for, and one dropped since it was listed is let
        be); returns the tables vacuumed."""
        done = [table for table in await due(conn, self.kept) if await pool.vacuum(conn, table)]
        if done:
            rows = await db.fetch_all(conn, "table_dead_rows", {"tables": done})
            self.kept.update({name: dead for name, dead in rows})
        return done
