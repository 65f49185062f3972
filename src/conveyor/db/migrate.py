"""Versioned migrations: numbered ``.sql`` files applied once each, in order.

``migrate`` is idempotent and safe to run from several processes at once (an advisory
lock serialises them); it only ever adds. ``bundle`` concatenates every migration into
one file that installs the schema from ``psql`` alone, recording the versions so that a
later ``conveyor db migrate`` knows where it stands.

Migrations are append-only once released: a changed function goes in a new migration.
Each applied migration's SHA-256 is recorded, and ``migrate`` and ``verify`` refuse a
database whose recorded migration differs from this build's file of the same number
(``errors.SchemaMismatch``): it was migrated by a build whose migration said something
else, so its functions are not the ones this code expects. Rows recorded before
checksums existed get this build's checksum the first time (nothing to compare them with).
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from datetime import datetime
from importlib import resources

from conveyor import errors
from conveyor.db import execute

log = logging.getLogger(__name__)

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_LOCK_KEY = 7306554611  # arbitrary constant: "conveyor migrate"

BOOTSTRAP = """\
CREATE SCHEMA IF NOT EXISTS conveyor;
CREATE TABLE IF NOT EXISTS conveyor.schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE conveyor.schema_migrations ADD COLUMN IF NOT EXISTS checksum text;
"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


@dataclass(frozen=True, slots=True)
class MigrationStatus:
    version: int
    name: str
    applied_at: datetime | None


def migrations() -> list[Migration]:
    folder = resources.files("conveyor") / "sql" / "migrations"
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return found


@dataclass(frozen=True, slots=True)
class _Applied:
    applied_at: datetime
    checksum: str | None


async def _applied(conn: execute.Connection) -> dict[int, _Applied]:
    cur = await conn.execute(
        "SELECT to_regclass('conveyor.schema_migrations') IS NOT NULL")
    row = await cur.fetchone()
    if not row or not row[0]:
        return {}
    cur = await conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = 'conveyor.schema_migrations'::regclass"
        " AND attname = 'checksum' AND NOT attisdropped)")
    row = await cur.fetchone()
    cur = await conn.execute("SELECT version, applied_at, checksum FROM conveyor.schema_migrations" if row and row[0]
                             # a database from before checksums
                             else "SELECT version, applied_at, NULL FROM conveyor.schema_migrations")
    return {v: _Applied(at, digest) for v, at, digest in await cur.fetchall()}


def _mismatch(m: Migration, recorded: str) -> errors.SchemaMismatch:
    return errors.SchemaMismatch(
        f"migration {m.label} recorded in this database (sha256 {recorded[:12]}...) differs from this build's "
        f"(sha256 {m.checksum[:12]}...): the database was migrated by another build of Conveyor whose migration "
        "said something else, so its functions may not be the ones this code expects. Run the build that "
        "migrated it, or restore the schema from a fresh database; if you have checked that the schema is what "
        "this build's migrations make, record this build's checksums with `conveyor db migrate --accept-checksums`.")


async def _check(conn: execute.Connection, applied: dict[int, _Applied], *, accept: bool) -> None:
    """Refuse recorded migrations that differ from this build's files (``accept``: record
    this build's checksums instead); fill in checksums recorded before they existed."""
    for m in migrations():
        found = applied.get(m.version)
        if found is None or found.checksum == m.checksum:
            continue
        if found.checksum is not None and not accept:
            raise _mismatch(m, found.checksum)
        if found.checksum is not None:
            log.warning("recording this build's checksum of migration %s (was %s)", m.label, found.checksum)
        await conn.execute("UPDATE conveyor.schema_migrations SET checksum = %s WHERE version = %s",
                           (m.checksum, m.version))


async def migrate(conn: execute.Connection, *, accept_checksums: bool = False) -> list[Migration]:
    """Apply every migration not yet applied, in one transaction, after checking those
    already applied against this build's (see the module's docstring). Returns those applied."""
    done: list[Migration] = []
    with execute.translated():
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            await conn.execute(BOOTSTRAP)
            applied = await _applied(conn)
            await _check(conn, applied, accept=accept_checksums)
            for migration in migrations():
                if migration.version in applied:
                    continue
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO conveyor.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (migration.version, migration.name, migration.checksum))
                done.append(migration)
    return done


async def verify(conn: execute.Connection) -> None:
    """Raise ``errors.SchemaMismatch`` if an applied migration differs from this build's
    (for servers that do not migrate); changes nothing."""
    with execute.translated():
        applied = await _applied(conn)
    for m in migrations():
        found = applied.get(m.version)
        if found is not None and found.checksum is not None and found.checksum != m.checksum:
            raise _mismatch(m, found.checksum)


async def status(conn: execute.Connection) -> list[MigrationStatus]:
    with execute.translated():
        applied = await _applied(conn)
    return [MigrationStatus(m.version, m.name, a.applied_at if (a := applied.get(m.version)) else None)
            for m in migrations()]


def bundle() -> str:
    """Every migration as one psql script that installs the schema on an empty database
    and is safe to run again: each migration runs only if its version is not recorded yet
    (psql's \\gset and \\if), so re-running it upgrades or does nothing."""
    parts = [
        "-- Conveyor schema: install (or upgrade) with  psql -v ON_ERROR_STOP=1 -f conveyor.sql",
        "-- Generated by `conveyor db sql`; equivalent to `conveyor db migrate`; safe to re-run.",
        "\\set ON_ERROR_STOP on",
        "BEGIN;",
        f"SELECT pg_advisory_xact_lock({_LOCK_KEY});",
        BOOTSTRAP,
    ]
    for m in migrations():
        parts += [
            f"-- migration {m.version:04d}_{m.name}",
            "SELECT NOT EXISTS (SELECT 1 FROM conveyor.schema_migrations "
            f"WHERE version = {m.version}) AS conveyor_apply \\gset",
            "\\if :conveyor_apply",
            m.sql.rstrip(),
            "INSERT INTO conveyor.schema_migrations (version, name, checksum) "
            f"VALUES ({m.version}, '{m.name}', '{m.checksum}');",
            "\\endif",
        ]
    parts.append("COMMIT;")
    return "\n".join(parts) + "\n"
