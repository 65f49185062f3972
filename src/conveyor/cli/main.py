"""``conveyor``: serve, manage the schema, queues and messages from the shell."""

from __future__ import annotations

import logging
import os

import click

import conveyor
from conveyor import logs
from conveyor.settings import Settings


class Context:
    """Options shared by every command (environment first, flags override)."""

    def __init__(self, database_url: str | None, data_dir: str | None, as_json: bool) -> None:
        self.overrides = {"database_url": database_url, "data_dir": data_dir}
        self.as_json = as_json

    def settings(self, **more: object) -> Settings:
        try:
            return Settings.from_env(**self.overrides, **more)
        except ValueError as exc:
            raise click.ClickException(f"configuration: {exc}") from None


@click.group(name="conveyor", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--database-url", envvar="DATABASE_URL", metavar="DSN",
              help="PostgreSQL to use [env DATABASE_URL]. Without it Conveyor runs its own "
                   "embedded cluster in --data-dir.")
@click.option("--data-dir", envvar="CONVEYOR_DATA_DIR", metavar="DIR",
              help="Directory of the embedded cluster [env CONVEYOR_DATA_DIR].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables (for scripts).")
@click.option("-v", "--verbose", count=True,
              help="Log what happens underneath (the embedded cluster starting...): -v info, -vv debug. "
                   "`serve` logs at info by default (--log-level).")
@click.version_option(conveyor.__version__, prog_name="conveyor")
@click.pass_context
def cli(ctx: click.Context, database_url: str | None, data_dir: str | None, as_json: bool, verbose: int) -> None:
    """Conveyor: a PostgreSQL-native message broker. Queues, topics and event streams
    stored in PostgreSQL, over the SQS and SNS wire protocols, REST and SQL; schedules;
    a Spark data pipeline."""
    ctx.obj = Context(database_url, data_dir, as_json)
    if verbose:
        logging.getLogger().setLevel(logging.DEBUG if verbose > 1 else logging.INFO)


def _register() -> None:
    from conveyor.cli import db, messages, queues, schedules, serve, status, streams, top, topics

    cli.add_command(serve.serve)
    cli.add_command(db.db)
    cli.add_command(queues.queues)
    cli.add_command(messages.send)
    cli.add_command(messages.receive)
    cli.add_command(messages.peek)
    cli.add_command(status.status)
    cli.add_command(top.top)
    cli.add_command(streams.streams)
    cli.add_command(topics.topics)
    cli.add_command(schedules.schedules)
    from conveyor.cli import pipeline  # the jobs import PySpark only when they run

    cli.add_command(pipeline.pipeline)


def main() -> None:
    fmt = os.environ.get("CONVEYOR_LOG_FORMAT") or "text"
    # commands print their results; what happens underneath is logged only when asked for
    # (-v), or when it goes wrong. `serve` sets its own level (--log-level, default info).
    logs.configure(fmt if fmt in logs.FORMATS else "text", logging.WARNING)  # Settings reports a bad value
    _register()
    cli(prog_name="conveyor")


if __name__ == "__main__":
    main()
