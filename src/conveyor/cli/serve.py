"""``conveyor serve``."""

from __future__ import annotations

import logging

import click

from conveyor import logs
from conveyor.cli import context

log = logging.getLogger("conveyor.serve")


@click.command()
@click.option("--host", envvar="CONVEYOR_HOST", default=None, help="Bind address [env CONVEYOR_HOST; default 127.0.0.1].")
@click.option("--port", envvar="CONVEYOR_PORT", type=int, default=None, help="Port [env CONVEYOR_PORT; default 9324].")
@click.option("--queen-port", envvar="CONVEYOR_QUEEN_PORT", type=int, default=None,
              help="Also serve on this port, e.g. 6632, Queen's default: the same server (Queen's API is at "
                   "/api/v1 on both ports) [env CONVEYOR_QUEEN_PORT].")
@click.option("--hq-port", envvar="CONVEYOR_HQ_PORT", type=int, default=None,
              help="Also serve on this port, e.g. 9999, hq's default: hq's API at the root, as hq clients expect "
                   "(it is at /hq on every port); installs the hq dialect [env CONVEYOR_HQ_PORT].")
@click.option("--workers", envvar="CONVEYOR_WORKERS", type=int, default=None,
              help="Server processes sharing the port, one per core to use "
                   "[env CONVEYOR_WORKERS; default: one per core this process may use (affinity, "
                   "cgroup CPU quota), at most 8].")
@click.option("--auth", "auth_mode", envvar="CONVEYOR_AUTH", type=click.Choice(["none", "header", "token", "jwt"]),
              default=None, help="Authentication [env CONVEYOR_AUTH; default header: any Authorization header].")
@click.option("--fusion/--no-fusion", default=None, help="Fuse concurrent sends into one SQL call [env CONVEYOR_FUSION].")
@click.option("--migrate/--no-migrate", default=None, help="Apply pending migrations at start [env CONVEYOR_MIGRATE; default on].")
@click.option("--log-level", envvar="CONVEYOR_LOG_LEVEL", default=None,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]), help="Log level.")
@click.option("--log-format", envvar="CONVEYOR_LOG_FORMAT", default=None, type=click.Choice(["text", "json"]),
              help="Log lines as text, or one JSON object per line [env CONVEYOR_LOG_FORMAT; default text].")
@click.pass_obj
def serve(obj, host, port, queen_port, hq_port, workers, auth_mode, fusion, migrate, log_level,  # noqa: ANN001
          log_format) -> None:  # noqa: ANN001
    """Run the server (SQS, SNS, REST, Queen's API, hq's API, health, metrics; the stream ticker,
    scheduler and webhook deliveries) until SIGTERM or Ctrl-C.

    Without DATABASE_URL it starts (and on exit stops) Conveyor's embedded PostgreSQL."""
    from conveyor.server import run

    settings = obj.settings(host=host, port=port, queen_port=queen_port, hq_port=hq_port, workers=workers,
                            auth_mode=auth_mode, fusion=fusion,
                            migrate=migrate, log_level=log_level, log_format=log_format)
    logs.configure(settings.log_format, settings.log_level)
    try:
        sockets = run.bind(settings)  # before anything is announced: a taken port is said at once
    except run.BindError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        with context.database_url(settings) as dsn:
            context.reach(dsn, log, settings.database_wait)
            where = "DATABASE_URL" if settings.database_url else "the embedded cluster"
            log.info("conveyor serving on http://%s:%s (database: %s; %d worker%s)", settings.host, settings.port,
                     where, settings.workers, "" if settings.workers == 1 else "s")
            if not run.serve(settings, dsn, sockets):
                raise click.ClickException("the server did not start, or a worker failed (see the log above)")
    finally:
        for sock in sockets:
            sock.close()
