"""``conveyor db``: the schema — apply migrations, print the one-file install, show status —
and the database itself: its URL, and psql on it."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import click

from conveyor import errors
from conveyor.cli import context, output
from conveyor.cli.output import Column
from conveyor.db import embedded
from conveyor.db import migrate as migrations


@click.group()
def db() -> None:
    """Manage Conveyor's schema in the database."""


def _dialects(value: str | None) -> tuple[str, ...]:
    try:
        return migrations.parse_dialects(value)
    except errors.InvalidInput as exc:
        raise click.BadParameter(exc.message, param_hint="--dialects") from None


_DIALECTS_HELP = ("Also install these dialects, comma-separated: " + ", ".join(migrations.DIALECTS)
                  + " (docs/dialects.md) [env CONVEYOR_DIALECTS]. Installed dialects are always upgraded.")


@db.command()
@click.option("--dialects", "dialects", default=None, help=_DIALECTS_HELP)
@click.option("--accept-checksums", is_flag=True,
              help="Record this build's checksum for applied migrations that differ from it, instead of "
                   "refusing (only after checking the schema is what this build's migrations make).")
@output.json_option
@click.pass_obj
def migrate(obj, dialects: str | None, accept_checksums: bool) -> None:  # noqa: ANN001
    """Apply pending migrations to the database, then the functions files if they changed.

    Safe to run again, or from several processes at once. Refuses a database whose applied
    migrations differ from this build's (their checksums are recorded), or that a newer
    build migrated."""
    # migrate=False: the embedded cluster must not be migrated behind this command's back,
    # or it would always report that nothing was left to apply
    settings = obj.settings()
    wanted = _dialects(dialects) if dialects is not None else settings.dialects

    async def action(conn: Any) -> list[migrations.Migration]:
        pending = sum(1 for s in await migrations.status(conn) if s.applied_at is None)
        with output.Progress("migrating", pending) as bar:
            return await migrations.migrate(conn, accept_checksums=accept_checksums, dialects=wanted,
                                            progress=lambda _: bar.update(bar.done + 1))

    applied = context.run(settings, action, migrate=False)
    done = [{"version": m.version, "name": m.name, "dialect": m.dialect, "label": m.label} for m in applied]
    output.emit(done, obj.as_json, lambda: "\n".join(f"applied {m['label']}" for m in done)
                if done else "schema is up to date")


@db.command()
@click.option("--dialects", "dialects", default=None, help="Include these dialects, comma-separated: "
              + ", ".join(migrations.DIALECTS) + ".")
def sql(dialects: str | None) -> None:
    """Print the whole schema as one psql install script.

    Touches no database: save it (conveyor db sql > conveyor.sql) and install it with
    psql -v ON_ERROR_STOP=1 -f conveyor.sql where migrations cannot run."""
    click.echo(migrations.bundle(_dialects(dialects)), nl=False)


@db.command()
@output.json_option
@click.pass_obj
def status(obj) -> None:  # noqa: ANN001
    """List every migration with the time it was applied, or "pending"."""
    found = context.run(obj.settings(), migrations.status, migrate=False)
    columns = [Column("VERSION", "version", lambda v: f"{v:04d}", right=True),
               Column("NAME", "name"),
               Column("APPLIED AT", lambda s: s.applied_at or "pending")]
    output.emit_rows(found, columns, obj.as_json, empty="no migrations")


@db.command()
@click.pass_obj
def url(obj) -> None:  # noqa: ANN001
    """Print the URL of the database the CLI uses: DATABASE_URL, else the embedded cluster's
    (psql "$(conveyor db url)"). The embedded cluster runs while `conveyor serve` does; when
    it is not running, this says so on stderr (conveyor db psql starts it for the session)."""
    settings = obj.settings()
    if settings.database_url:
        click.echo(settings.database_url)
        return
    cluster = context.embedded_cluster(settings)
    try:
        click.echo(cluster.dsn)
    except embedded.EmbeddedError:
        raise click.ClickException(f"the embedded cluster in {cluster.data_dir} was never started: run "
                                   "`conveyor serve` (or `conveyor db psql`) first") from None
    if not cluster.is_running():
        output.note(f"note: the embedded cluster in {cluster.data_dir} is not running; start `conveyor serve`, "
                    "or use `conveyor db psql`, which starts it for the session")


@db.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("psql_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def psql(obj, psql_args: tuple[str, ...]) -> None:  # noqa: ANN001
    """Open psql on the database the CLI uses (DATABASE_URL, else the embedded cluster, started
    for the session if no server runs it). Arguments after the command go to psql:
    conveyor db psql -c 'select * from conveyor.queues'."""
    program = shutil.which("psql") or _beside_server_programs("psql")
    if program is None:
        raise click.ClickException("psql is not installed (Debian: apt-get install postgresql-client)")
    settings = obj.settings()
    with context.database_url(settings) as dsn:
        code = subprocess.call([program, dsn, *psql_args])
    raise SystemExit(code)


def _beside_server_programs(name: str) -> str | None:
    try:
        candidate = embedded.find_binaries() / name
    except embedded.EmbeddedError:
        return None
    return str(candidate) if candidate.exists() else None
