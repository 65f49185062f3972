"""Versioned migrations: numbered ``.sql`` files applied once each, in order.

``migrate`` is idempotent and safe to run from several processes at once (an advisory
lock serialises them); it only ever adds. ``bundle`` concatenates every migration into
one file that installs the schema from ``psql`` alone, recording the versions so that a
later ``conveyor db migrate`` knows where it stands.

Migrations are append-only once released: a changed function goes in a new migration.
Numbers increase but may leave gaps (work developed in parallel takes numbers ahead of
time and lands in any order); a database is migrated in number order only, so one that
already has a migration numbered above a missing one is refused rather than given the
missing one late (``errors.SchemaMismatch``: the later one may redefine what it defines).
Each applied migration's SHA-256 is recorded, and ``migrate`` and ``verify`` refuse a
database whose recorded migration differs from this build's file of the same number
(``errors.SchemaMismatch``): it was migrated by a build whose migration said something
else, so its functions are not the ones this code expects. Rows recorded before
checksums existed get this build's checksum the first time (nothing to compare them with).

Dialects (``DIALECTS``: pgmq, PgQue and PgQ's SQL interfaces over Conveyor's engine,
docs/dialects.md) are optional: each has its own numbered migrations in
``sql/dialects/<dialect>/``, recorded in ``conveyor.dialect_migrations`` with checksums
under the same rules. A dialect is installed when asked for (``migrate(dialects=...)``,
``conveyor db migrate --dialects``, ``CONVEYOR_DIALECTS``) and from then on upgraded by
every ``migrate``. Installing one is refused while the real extension (or a schema of
that name that Conveyor did not create) is in the database.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from importlib import resources

from conveyor import errors, settings
from conveyor.db import execute
from conveyor.settings import DIALECTS

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
CREATE TABLE IF NOT EXISTS conveyor.dialect_migrations (
    dialect    text NOT NULL,
    version    integer NOT NULL,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (dialect, version)
);
"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str
    dialect: str | None = None

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()

    @property
    def label(self) -> str:
        prefix = f"{self.dialect}/" if self.dialect else ""
        return f"{prefix}{self.version:04d}_{self.name}"


@dataclass(frozen=True, slots=True)
class MigrationStatus:
    version: int
    name: str
    applied_at: datetime | None


def migrations(dialect: str | None = None) -> list[Migration]:
    """Conveyor's migrations, or a dialect's (``DIALECTS``), in order."""
    sql = resources.files("conveyor") / "sql"
    if dialect is None:
        folder = sql / "migrations"
    elif dialect in DIALECTS:
        folder = sql / "dialects" / dialect
    else:
        raise errors.InvalidInput(f"unknown dialect {dialect!r}: choose from {', '.join(DIALECTS)}")
    found = []
    for entry in folder.iterdir() if folder.is_dir() else ():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text("utf-8"), dialect))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions) or (versions and versions[0] < 1):
        raise RuntimeError(f"migrations must have distinct numbers from 1 up, found {versions}")
    return found


def _refuse_out_of_order(pending: Migration, applied: set[int]) -> None:
    """A migration is applied only while nothing numbered above it is (see the module's
    docstring)."""
    later = sorted(v for v in applied if v > pending.version)
    if later:
        raise errors.SchemaMismatch(
            f"migration {pending.label} is not applied to this database but later ones are ({later[0]:04d}...): "
            "it was migrated by a build that did not have this migration. Migrations apply in number order only; "
            "recreate the database (or restore it from one migrated in order) with this build.")


def parse_dialects(value: str | None) -> tuple[str, ...]:
    """``"pgmq,pgq"`` -> ("pgmq", "pgq"), each checked (errors.InvalidInput)."""
    try:
        return settings.parse_dialects(value)
    except ValueError as exc:
        raise errors.InvalidInput(str(exc)) from None


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


async def _dialects_applied(conn: execute.Connection) -> dict[str, dict[int, _Applied]]:
    cur = await conn.execute("SELECT to_regclass('conveyor.dialect_migrations') IS NOT NULL")
    row = await cur.fetchone()
    if not row or not row[0]:
        return {}
    cur = await conn.execute("SELECT dialect, version, applied_at, checksum FROM conveyor.dialect_migrations")
    found: dict[str, dict[int, _Applied]] = {}
    for dialect, version, at, digest in await cur.fetchall():
        found.setdefault(dialect, {})[version] = _Applied(at, digest)
    return found


async def _refuse_foreign(conn: execute.Connection, dialect: str) -> None:
    """Installing a dialect next to the real thing would shadow or break it."""
    schema = DIALECTS[dialect]
    cur = await conn.execute("SELECT extname FROM pg_catalog.pg_extension WHERE extname = %s", (schema,))
    if await cur.fetchone():
        raise errors.SchemaMismatch(
            f"the {schema} extension is installed in this database: Conveyor's {dialect} dialect would take its "
            f"schema. Move its queues to Conveyor first (docs/dialects.md), DROP EXTENSION {schema}, then install "
            "the dialect.")
    cur = await conn.execute("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s", (schema,))
    if await cur.fetchone():
        raise errors.SchemaMismatch(
            f"a schema named {schema} that Conveyor did not create is in this database (the real {dialect}, "
            f"installed from SQL?): Conveyor's {dialect} dialect would replace it. Move its data first "
            "(docs/dialects.md), drop the schema, then install the dialect.")


async def _migrate_dialect(conn: execute.Connection, dialect: str, applied: dict[int, _Applied], *,
                           accept: bool) -> list[Migration]:
    done = []
    if not applied:
        await _refuse_foreign(conn, dialect)
    for m in migrations(dialect):
        found = applied.get(m.version)
        if found is not None:
            if found.checksum != m.checksum:
                if not accept:
                    raise _mismatch(m, found.checksum or "")
                await conn.execute("UPDATE conveyor.dialect_migrations SET checksum = %s "
                                   "WHERE dialect = %s AND version = %s", (m.checksum, dialect, m.version))
            continue
        _refuse_out_of_order(m, set(applied))
        await conn.execute(m.sql)
        await conn.execute("INSERT INTO conveyor.dialect_migrations (dialect, version, name, checksum) "
                           "VALUES (%s, %s, %s, %s)", (dialect, m.version, m.name, m.checksum))
        done.append(m)
    return done


async def migrate(conn: execute.Connection, *, accept_checksums: bool = False,
                  dialects: tuple[str, ...] = (),
                  progress: Callable[[Migration], None] | None = None) -> list[Migration]:
    """Apply every migration not yet applied, in one transaction, after checking those
    already applied against this build's (see the module's docstring): Conveyor's, then
    those of the dialects asked for and of those installed before. Returns those applied."""
    done: list[Migration] = []
    for dialect in dialects:
        migrations(dialect)  # an unknown name is refused before anything runs
    with execute.translated():
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            await conn.execute(BOOTSTRAP)
            applied = await _applied(conn)
            await _check(conn, applied, accept=accept_checksums)
            for migration in migrations():
                if migration.version in applied:
                    continue
                _refuse_out_of_order(migration, set(applied))
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO conveyor.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (migration.version, migration.name, migration.checksum))
                done.append(migration)
                if progress is not None:
                    progress(migration)
            installed = await _dialects_applied(conn)
            for dialect in DIALECTS:
                if dialect in dialects or dialect in installed:
                    done += await _migrate_dialect(conn, dialect, installed.get(dialect, {}),
                                                   accept=accept_checksums)
    return done


async def installed_dialects(conn: execute.Connection) -> list[str]:
    """The dialects installed in the database."""
    with execute.translated():
        return sorted(await _dialects_applied(conn))


async def verify(conn: execute.Connection) -> None:
    """Raise ``errors.SchemaMismatch`` if an applied migration differs from this build's
    (for servers that do not migrate); changes nothing."""
    with execute.translated():
        applied = await _applied(conn)
        dialects = await _dialects_applied(conn)
    for m in migrations() + [m for d in DIALECTS if d in dialects for m in migrations(d)]:
        found = (dialects.get(m.dialect, {}) if m.dialect else applied).get(m.version)
        if found is not None and found.checksum is not None and found.checksum != m.checksum:
            raise _mismatch(m, found.checksum)


async def status(conn: execute.Connection) -> list[MigrationStatus]:
    with execute.translated():
        applied = await _applied(conn)
    return [MigrationStatus(m.version, m.name, a.applied_at if (a := applied.get(m.version)) else None)
            for m in migrations()]


def _bundle_order_check(table: str, where: str, m: Migration) -> str:
    """The bundle's form of ``_refuse_out_of_order``: stop before a migration numbered
    below one the database already has."""
    return (f"DO $order$ BEGIN IF EXISTS (SELECT 1 FROM {table} WHERE {where} AND version > {m.version}) THEN "
            f"RAISE EXCEPTION 'migration {m.label} is not applied but later ones are: migrations apply in number "
            "order only; recreate the database with this build'; END IF; END $order$;")


def bundle(dialects: tuple[str, ...] = ()) -> str:
    """Every migration (and those of ``dialects``) as one psql script that installs the
    schema on an empty database and is safe to run again: each migration runs only if its
    version is not recorded yet (psql's \\gset and \\if), so re-running it upgrades or
    does nothing."""
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
            _bundle_order_check("conveyor.schema_migrations", "true", m),
            m.sql.rstrip(),
            "INSERT INTO conveyor.schema_migrations (version, name, checksum) "
            f"VALUES ({m.version}, '{m.name}', '{m.checksum}');",
            "\\endif",
        ]
    for dialect in DIALECTS:
        if dialect not in dialects:
            continue
        for m in migrations(dialect):
            parts += [
                f"-- dialect migration {m.label}",
                "SELECT NOT EXISTS (SELECT 1 FROM conveyor.dialect_migrations "
                f"WHERE dialect = '{dialect}' AND version = {m.version}) AS conveyor_apply \\gset",
                "\\if :conveyor_apply",
                _bundle_order_check("conveyor.dialect_migrations", f"dialect = '{dialect}'", m),
                m.sql.rstrip(),
                "INSERT INTO conveyor.dialect_migrations (dialect, version, name, checksum) "
                f"VALUES ('{dialect}', {m.version}, '{m.name}', '{m.checksum}');",
                "\\endif",
            ]
    parts.append("COMMIT;")
    return "\n".join(parts) + "\n"
