"""The schema: numbered migrations applied once each, in order, then the functions files.

``migrate`` is idempotent and safe to run from several processes at once (an advisory
lock serialises them). ``bundle`` concatenates everything into one file that installs the
schema from ``psql`` alone, recording what it applied so that a later ``conveyor db
migrate`` knows where it stands.

Numbered migrations (``sql/migrations/NNNN_*.sql``) hold tables, types, indexes, data and
drops, and are append-only once landed. Numbers increase but may leave gaps (work
developed in parallel takes numbers ahead of time and lands in any order); a database is
migrated in number order only, so one that already has a migration numbered above a
missing one is refused rather than given the missing one late (``errors.SchemaMismatch``).
Each applied migration's SHA-256 is recorded, and ``migrate`` and ``verify`` refuse a
database whose recorded migration differs from this build's file of the same number
(``errors.SchemaMismatch``): it was migrated by a build whose migration said something
else. Rows recorded before checksums existed get this build's checksum the first time.

Functions files (``sql/functions/NN_<concept>.sql``) hold every function and view as it
stands, as ``CREATE OR REPLACE`` statements: after the migrations, all of them are applied
again, in order, whenever any differs from the checksums recorded in
``conveyor.schema_functions`` (repeatable, as Flyway's repeatable migrations). ``verify``
refuses a database whose recorded functions differ from this build's; ``migrate`` refuses
to replace the functions of a database migrated by a newer build (one with a migration
this build lacks). docs/architecture.md, "Where each SQL function's current definition
lives", has the rules.

Dialects (``DIALECTS``: pgmq, PgQue and PgQ's SQL interfaces over Conveyor's engine,
docs/dialects.md) are optional: each has its own numbered migrations in
``sql/dialects/<dialect>/``, recorded in ``conveyor.dialect_migrations`` with checksums
under the same rules, and its functions files in ``sql/dialects/<dialect>/functions/``.
A dialect is installed when asked for (``migrate(dialects=...)``, ``conveyor db migrate
--dialects``, ``CONVEYOR_DIALECTS``) and from then on upgraded by every ``migrate``.
Installing one is refused while the real extension (or a schema of that name that
Conveyor did not create) is in the database.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import psycopg

from conveyor import errors, settings
from conveyor.db import execute
from conveyor.settings import DIALECTS

log = logging.getLogger(__name__)

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql(?:\.gz)?$")  # .gz: history (docs/architecture.md)
_FUNCTIONS_FILE = re.compile(r"^(\d{2})_([a-z0-9_]+)\.sql$")
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
CREATE TABLE IF NOT EXISTS conveyor.schema_functions (
    scope      text NOT NULL,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, name)
);
"""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str
    dialect: str | None = None
    functions: bool = False  # a functions file (``functions()``): version is its place in the order

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()

    @property
    def stem(self) -> str:
        return f"{self.version:02d}_{self.name}" if self.functions else f"{self.version:04d}_{self.name}"

    @property
    def label(self) -> str:
        prefix = f"{self.dialect}/" if self.dialect else ""
        return f"{prefix}{'functions/' if self.functions else ''}{self.stem}"


@dataclass(frozen=True, slots=True)
class MigrationStatus:
    version: int
    name: str
    applied_at: datetime | None


def _folder(dialect: str | None) -> Traversable:
    sql = resources.files("conveyor") / "sql"
    if dialect is None:
        return sql / "migrations"
    if dialect in DIALECTS:
        return sql / "dialects" / dialect
    raise errors.InvalidInput(f"unknown dialect {dialect!r}: choose from {', '.join(DIALECTS)}")


def _files(folder: Traversable, pattern: re.Pattern[str], dialect: str | None, kind: bool) -> list[Migration]:
    found = []
    for entry in folder.iterdir() if folder.is_dir() else ():
        match = pattern.match(entry.name)
        if match:
            text = (gzip.decompress(entry.read_bytes()).decode("utf-8") if entry.name.endswith(".gz")
                    else entry.read_text("utf-8"))
            found.append(Migration(int(match[1]), match[2], text, dialect, kind))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions) or (versions and versions[0] < 1):
        raise RuntimeError(f"{folder}: files must have distinct numbers from 1 up, found {versions}")
    return found


def migrations(dialect: str | None = None) -> list[Migration]:
    """Conveyor's numbered migrations, or a dialect's (``DIALECTS``), in order."""
    return _files(_folder(dialect), _FILE, dialect, False)


def functions(dialect: str | None = None) -> list[Migration]:
    """Conveyor's functions files (``sql/functions/NN_concept.sql``), or a dialect's
    (``sql/dialects/<dialect>/functions/``), in the order they are applied."""
    folder = _folder(dialect) / "functions" if dialect else resources.files("conveyor") / "sql" / "functions"
    return _files(folder, _FUNCTIONS_FILE, dialect, True)


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


def _functions_mismatch(scope: str, files: list[Migration], recorded: dict[str, str]) -> errors.SchemaMismatch:
    ours = {f.stem: f.checksum for f in files}
    differ = sorted(set(ours) ^ set(recorded) | {n for n in ours if n in recorded and ours[n] != recorded[n]})
    where = "" if scope == "conveyor" else f"{scope}/"
    return errors.SchemaMismatch(
        f"the functions in this database are not this build's ({where}functions/{differ[0]}"
        f"{f' and {len(differ) - 1} more' if len(differ) > 1 else ''} differ): it was migrated by another "
        "build of Conveyor, or not since this build's functions changed. Run `conveyor db migrate` with this "
        "build (it re-applies the functions files), or run the build that migrated it.")


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


async def _bookkeeping(conn: execute.Connection, table: str, query: str) -> list[Any]:
    """The rows of one of the bookkeeping tables, none before it exists."""
    cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,))
    row = await cur.fetchone()
    if not row or not row[0]:
        return []
    cur = await conn.execute(query)
    return await cur.fetchall()


async def _dialects_applied(conn: execute.Connection) -> dict[str, dict[int, _Applied]]:
    found: dict[str, dict[int, _Applied]] = {}
    for dialect, version, at, digest in await _bookkeeping(
            conn, "conveyor.dialect_migrations",
            "SELECT dialect, version, applied_at, checksum FROM conveyor.dialect_migrations"):
        found.setdefault(dialect, {})[version] = _Applied(at, digest)
    return found


async def _functions_recorded(conn: execute.Connection) -> dict[str, dict[str, str]]:
    """scope ('conveyor' or a dialect) -> {file stem: checksum} as the database records them."""
    found: dict[str, dict[str, str]] = {}
    for scope, name, digest in await _bookkeeping(conn, "conveyor.schema_functions",
                                                  "SELECT scope, name, checksum FROM conveyor.schema_functions"):
        found.setdefault(scope, {})[name] = digest
    return found


def _functions_differ(files: list[Migration], recorded: dict[str, str]) -> bool:
    return recorded != {f.stem: f.checksum for f in files}


def _refuse_newer(applied: dict[int, _Applied], known: list[Migration]) -> None:
    """Functions files are re-applied whenever they differ from the database's; a database
    migrated by a newer build (a numbered migration this build does not have) would get
    this build's older functions back: refused."""
    newer = sorted(set(applied) - {m.version for m in known})
    if newer:
        prefix = f"{known[0].dialect}/" if known and known[0].dialect else ""
        raise errors.SchemaMismatch(
            f"migration {prefix}{newer[-1]:04d} recorded in this database is not in this build: the database was "
            "migrated by a newer build of Conveyor, and this build would replace that build's functions with its "
            "own older ones. Run the newer build.")


async def _apply_functions(conn: execute.Connection, scope: str, files: list[Migration],
                           recorded: dict[str, str]) -> list[Migration]:
    """Every functions file of ``scope``, in order, when any of them differs from what the
    database records (all of them: a later file may re-create what an earlier one's
    function needs, and plans.sql's settings follow every re-created function)."""
    if not _functions_differ(files, recorded):
        return []
    for f in files:
        await conn.execute(f.sql)
    await conn.execute("DELETE FROM conveyor.schema_functions WHERE scope = %s", (scope,))
    for f in files:
        await conn.execute("INSERT INTO conveyor.schema_functions (scope, name, checksum) VALUES (%s, %s, %s)",
                           (scope, f.stem, f.checksum))
    return files


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
    recorded = (await _functions_recorded(conn)).get(dialect, {})
    if _functions_differ(functions(dialect), recorded):
        _refuse_newer(applied, migrations(dialect))
    return done + await _apply_functions(conn, dialect, functions(dialect), recorded)


# Attempts of a migration that lost a race for the cluster's roles (see migrate).
_ROLE_RACE_ATTEMPTS = 5


def _lost_role_race(exc: psycopg.Error) -> bool:
    """The error of a migration that created or granted a role (cluster-wide, not covered
    by the database's advisory lock) while another database's migration did the same:
    a unique violation in a shared catalog, or the role found made meanwhile."""
    if isinstance(exc, psycopg.errors.UniqueViolation):
        return exc.diag.schema_name == "pg_catalog"
    return isinstance(exc, psycopg.errors.DuplicateObject) and "role" in (exc.diag.message_primary or "")


async def migrate(conn: execute.Connection, *, accept_checksums: bool = False,
                  dialects: tuple[str, ...] = (),
                  progress: Callable[[Migration], None] | None = None) -> list[Migration]:
    """Apply every migration not yet applied, in one transaction, after checking those
    already applied against this build's (see the module's docstring), then the functions
    files if they differ from the database's: Conveyor's, then those of the dialects asked
    for and of those installed before. Returns the migrations and functions files applied.

    The advisory lock serialises the migrations of one database. Roles are the cluster's:
    two databases of a new cluster migrated at once (two servers started together) both
    create them, and the second to commit fails; its transaction rolled back, it runs
    again, and finds them."""
    for dialect in dialects:
        migrations(dialect)  # an unknown name is refused before anything runs
    with execute.translated():
        attempt = 1
        while True:
            try:
                return await _migrate_once(conn, accept_checksums, dialects, progress)
            except psycopg.Error as exc:
                if attempt == _ROLE_RACE_ATTEMPTS or not _lost_role_race(exc):
                    raise
                attempt += 1
                log.info("another database's migration created Conveyor's roles meanwhile: migrating again (%s)",
                         exc.diag.message_primary)


async def _migrate_once(conn: execute.Connection, accept_checksums: bool, dialects: tuple[str, ...],
                        progress: Callable[[Migration], None] | None) -> list[Migration]:
    """One attempt of ``migrate``, in one transaction."""
    done: list[Migration] = []
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
        recorded = (await _functions_recorded(conn)).get("conveyor", {})
        if _functions_differ(functions(), recorded):
            _refuse_newer(applied, migrations())
        done += await _apply_functions(conn, "conveyor", functions(), recorded)
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
        recorded = await _functions_recorded(conn)
    for m in migrations() + [m for d in DIALECTS if d in dialects for m in migrations(d)]:
        found = (dialects.get(m.dialect, {}) if m.dialect else applied).get(m.version)
        if found is not None and found.checksum is not None and found.checksum != m.checksum:
            raise _mismatch(m, found.checksum)
    for scope in ["conveyor"] + [d for d in DIALECTS if d in dialects]:
        files = functions(None if scope == "conveyor" else scope)
        if _functions_differ(files, recorded.get(scope, {})):
            raise _functions_mismatch(scope, files, recorded.get(scope, {}))


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


def _bundle_functions(dialect: str | None) -> list[str]:
    """The bundle's form of ``_apply_functions`` (and ``_refuse_newer``)."""
    scope = dialect or "conveyor"
    files = functions(dialect)
    known = ", ".join(str(m.version) for m in migrations(dialect))
    table, where = (("conveyor.dialect_migrations", f"dialect = '{dialect}' AND ") if dialect
                    else ("conveyor.schema_migrations", ""))
    wanted = ", ".join(f"'{f.stem}:{f.checksum}'" for f in files)
    parts = [
        f"-- functions files of {scope}: all of them again when any differs from the database's",
        "SELECT coalesce((SELECT array_agg(name || ':' || checksum ORDER BY name) FROM conveyor.schema_functions "
        f"WHERE scope = '{scope}'), '{{}}') IS DISTINCT FROM ARRAY[{wanted}]::text[] AS conveyor_apply \\gset",
        "\\if :conveyor_apply",
        f"DO $newer$ BEGIN IF EXISTS (SELECT 1 FROM {table} WHERE {where}version NOT IN ({known})) THEN "
        "RAISE EXCEPTION 'this database was migrated by a newer build of Conveyor (a migration this script does "
        "not have): its functions would be replaced with older ones; run the newer build'; END IF; END $newer$;",
    ]
    for f in files:
        parts += [f"-- functions file {f.label}", f.sql.rstrip()]
    parts += [
        f"DELETE FROM conveyor.schema_functions WHERE scope = '{scope}';",
        "INSERT INTO conveyor.schema_functions (scope, name, checksum) VALUES "
        + ", ".join(f"('{scope}', '{f.stem}', '{f.checksum}')" for f in files) + ";",
        "\\endif",
    ]
    return parts


def bundle(dialects: tuple[str, ...] = ()) -> str:
    """Every migration and functions file (and those of ``dialects``) as one psql script
    that installs the schema on an empty database and is safe to run again: each migration
    runs only if its version is not recorded yet, and the functions files only if they
    differ from those recorded (psql's \\gset and \\if), so re-running it upgrades or
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
    parts += _bundle_functions(None)
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
        parts += _bundle_functions(dialect)
    parts.append("COMMIT;")
    return "\n".join(parts) + "\n"
