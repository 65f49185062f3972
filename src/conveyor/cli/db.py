"""``conveyor db``: the schema — apply migrations, print the one-file install, show status."""

from __future__ import annotations

import click

from conveyor.cli import context, output
from conveyor.cli.output import Column
from conveyor.db import migrate as migrations


@click.group()
def db() -> None:
    """Manage Conveyor's schema in the database."""


@db.command()
@click.option("--accept-checksums", is_flag=True,
              help="Record this build's checksum for applied migrations that differ from it, instead of "
                   "refusing (only after checking the schema is what this build's migrations make).")
@output.json_option
@click.pass_obj
def migrate(obj, accept_checksums: bool) -> None:  # noqa: ANN001
    """Apply pending migrations to the database.

    Safe to run again, or from several processes at once. Refuses a database whose applied
    migrations differ from this build's (their checksums are recorded)."""
    # migrate=False: the embedded cluster must not be migrated behind this command's back,
    # or it would always report that nothing was left to apply
    applied = context.run(obj.settings(), lambda conn: migrations.migrate(conn, accept_checksums=accept_checksums),
                          migrate=False)
    done = [{"version": m.version, "name": m.name} for m in applied]
    output.emit(done, obj.as_json, lambda: "\n".join(f"applied {_label(m)}" for m in done)
                if done else "schema is up to date")


@db.command()
def sql() -> None:
    """Print the whole schema as one psql install script.

    Touches no database: save it (conveyor db sql > conveyor.sql) and install it with
    psql -v ON_ERROR_STOP=1 -f conveyor.sql where migrations cannot run."""
    click.echo(migrations.bundle(), nl=False)


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


def _label(m: dict) -> str:
    return f"{m['version']:04d}_{m['name']}"
