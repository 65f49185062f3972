"""``conveyor db``: the schema — apply migrations, print the one-file install, show status."""

from __future__ import annotations

from typing import Any

import click

from conveyor import errors
from conveyor.cli import context, output
from conveyor.cli.output import Column
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
    """Apply pending migrations to the database.

    Safe to run again, or from several processes at once. Refuses a database whose applied
    migrations differ from this build's (their checksums are recorded)."""
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
